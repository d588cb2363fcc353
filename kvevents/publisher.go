package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Publisher sends KV-cache events as vLLM's ZMQ publisher does: a PUB
// socket, numbered batches, and a ROUTER socket that replays the last
// batches it keeps. Publish never waits on a subscriber.
type Publisher struct {
	pub, router zmq4.Socket
	topic       []byte
	cancel      context.CancelFunc
	wg          sync.WaitGroup

	mu     sync.Mutex
	queue  []Batch
	wake   chan struct{}
	closed bool

	bufMu sync.Mutex
	seq   int64
	ring  [][]byte // the last batches sent, ring[seq % len(ring)]
	first int64    // the oldest seq still in ring
}

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// Endpoint is where the PUB socket listens (tcp://127.0.0.1:0 picks
	// a port; PubAddr tells it).
	Endpoint string
	// Replay is where the ROUTER socket listens ("": no replay).
	Replay string
	Topic  string
	// Keep is how many batches the ROUTER can replay (default 10,000, as vLLM's buffer_steps).
	Keep int
}

// Publish opens the sockets.
func Publish(o PublisherOptions) (*Publisher, error) {
	if o.Keep <= 0 {
		o.Keep = 10_000
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{pub: zmq4.NewPub(ctx), topic: []byte(o.Topic), cancel: cancel,
		wake: make(chan struct{}, 1), ring: make([][]byte, o.Keep)}
	if err := p.pub.Listen(o.Endpoint); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", o.Endpoint, err)
	}
	if o.Replay != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
		if err := p.router.Listen(o.Replay); err != nil {
			cancel()
			p.pub.Close()
			p.router.Close()
			return nil, fmt.Errorf("kvevents: listen %s: %w", o.Replay, err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	p.wg.Add(1)
	go p.send()
	return p, nil
}

// PubAddr is the PUB socket's address as a subscriber dials it.
func (p *Publisher) PubAddr() string { return "tcp://" + p.pub.Addr().String() }

// ReplayAddr is the ROUTER socket's address ("" without one).
func (p *Publisher) ReplayAddr() string {
	if p.router == nil {
		return ""
	}
	return "tcp://" + p.router.Addr().String()
}

// Send queues a batch of events (stamped now); batches go out in the
// order queued.
func (p *Publisher) Send(events ...Event) {
	p.mu.Lock()
	if !p.closed {
		p.queue = append(p.queue, Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events})
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close stops the publisher after sending what is queued.
func (p *Publisher) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	p.cancel()
	p.wg.Wait()
	p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
}

func (p *Publisher) send() {
	defer p.wg.Done()
	var seqb [8]byte
	for {
		p.mu.Lock()
		q, closed := p.queue, p.closed
		p.queue = nil
		p.mu.Unlock()
		for _, b := range q {
			payload := AppendBatch(nil, b)
			p.bufMu.Lock()
			seq := p.seq
			p.seq++
			p.ring[seq%int64(len(p.ring))] = payload
			if seq-p.first >= int64(len(p.ring)) {
				p.first = seq - int64(len(p.ring)) + 1
			}
			p.bufMu.Unlock()
			binary.BigEndian.PutUint64(seqb[:], uint64(seq))
			_ = p.pub.Send(zmq4.NewMsgFrom(p.topic, append([]byte(nil), seqb[:]...), payload))
		}
		if closed {
			return
		}
		<-p.wake
	}
}

// serveReplay answers [identity, empty, start] with each kept batch from
// start on, then the end marker (-1).
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if strings.Contains(err.Error(), "context canceled") || p.isClosed() {
				return
			}
			continue
		}
		f := msg.Frames
		if len(f) != 3 || len(f[2]) != 8 {
			continue
		}
		id, start := f[0], int64(binary.BigEndian.Uint64(f[2]))
		p.bufMu.Lock()
		var out [][2][]byte
		for s := max(start, p.first); s < p.seq; s++ {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], uint64(s))
			out = append(out, [2][]byte{sb[:], p.ring[s%int64(len(p.ring))]})
		}
		p.bufMu.Unlock()
		for _, o := range out {
			_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, o[0], o[1]))
		}
		end := make([]byte, 8)
		binary.BigEndian.PutUint64(end, ^uint64(0))
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

func (p *Publisher) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}
