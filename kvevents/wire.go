// Package kvevents reads a model server's own account of its KV cache: the
// KV-cache events vLLM publishes when started with --kv-events-config
// (BlockStored, BlockRemoved, AllBlocksCleared, in msgpack-encoded batches
// over a ZeroMQ PUB socket, with a ROUTER socket that replays missed
// batches), into a per-node index of the prompt blocks the node really
// holds. It also publishes the same events, for the simulator.
//
// The wire format, as vLLM sends it:
//   - each message has three frames: the topic, the batch's sequence number
//     (8 bytes, big-endian, from 0 at the publisher's start) and the batch;
//   - a batch is [ts, events, data_parallel_rank] (vLLM's array_like
//     structs) or, from versions that dropped array_like, a map with those
//     keys; both are read;
//   - an event is ["BlockStored", block_hashes, parent_block_hash,
//     token_ids, block_size, lora_id, medium, ...], ["BlockRemoved",
//     block_hashes, medium, ...] or ["AllBlocksCleared"], or a map with the
//     tag under "type"; fields past the ones read here are skipped;
//   - a block hash is an integer (older versions) or a byte string (a
//     sha256 digest); byte strings are folded to 64 bits here;
//   - replay: a DEALER sends [empty, start sequence as 8 bytes] to the
//     ROUTER, which answers [empty, seq, batch] for each batch it still
//     holds from start on, then [empty, -1 as 8 bytes, empty].
package kvevents

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is an event's type.
type Kind uint8

// The events a node publishes.
const (
	BlockStored      Kind = iota + 1 // blocks were computed and cached
	BlockRemoved                     // blocks were evicted
	AllBlocksCleared                 // the cache was emptied
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one KV-cache event.
type Event struct {
	Kind Kind
	// Hashes are the node's block hashes, in prompt order for BlockStored.
	Hashes []uint64
	// Parent is the hash of the block before the first of Hashes
	// (BlockStored; HasParent false: they start the prompt).
	Parent    uint64
	HasParent bool
	// Tokens are the stored blocks' token ids, BlockSize of them a block.
	Tokens    []uint32
	BlockSize int
}

// Batch is what one message carries.
type Batch struct {
	TS     float64 // seconds since the epoch, at the publisher
	Events []Event
}

var errFormat = errors.New("kvevents: not a KV event batch")

// DecodeBatch reads a batch in either of vLLM's encodings. Events of kinds
// it does not know are skipped.
func DecodeBatch(payload []byte) (Batch, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	var b Batch
	code, err := d.PeekCode()
	if err != nil {
		return b, err
	}
	if isMap(code) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return b, err
		}
		for i := 0; i < n; i++ {
			k, err := d.DecodeString()
			if err != nil {
				return b, err
			}
			switch k {
			case "ts":
				b.TS, err = d.DecodeFloat64()
			case "events":
				b.Events, err = decodeEvents(d)
			default:
				err = d.Skip()
			}
			if err != nil {
				return b, fmt.Errorf("kvevents: batch %s: %w", k, err)
			}
		}
		return b, nil
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, errFormat
	}
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return b, fmt.Errorf("kvevents: batch ts: %w", err)
	}
	if b.Events, err = decodeEvents(d); err != nil {
		return b, err
	}
	return b, nil // the rank and anything after it are not needed
}

func isMap(c byte) bool { return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 }

func decodeEvents(d *msgpack.Decoder) ([]Event, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, max(n, 0))
	for i := 0; i < n; i++ {
		e, err := decodeEvent(d)
		if err != nil {
			return nil, fmt.Errorf("kvevents: event %d: %w", i, err)
		}
		if e.Kind != 0 {
			out = append(out, e)
		}
	}
	return out, nil
}

// The fields of each kind in array order (after the tag).
var fieldOrder = map[Kind][]string{
	BlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size"},
	BlockRemoved:     {"block_hashes"},
	AllBlocksCleared: nil,
}

func kindOf(tag string) Kind {
	switch tag {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

func decodeEvent(d *msgpack.Decoder) (Event, error) {
	var e Event
	code, err := d.PeekCode()
	if err != nil {
		return e, err
	}
	if isMap(code) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return e, err
		}
		// The tag comes first as msgspec writes it; fields are read by name
		// whatever their order.
		for i := 0; i < n; i++ {
			k, err := d.DecodeString()
			if err != nil {
				return e, err
			}
			if k == "type" {
				tag, err := d.DecodeString()
				if err != nil {
					return e, err
				}
				e.Kind = kindOf(tag)
				continue
			}
			if err := decodeField(d, &e, k); err != nil {
				return e, err
			}
		}
		return e, nil
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return e, err
	}
	if n < 1 {
		return e, errFormat
	}
	tag, err := d.DecodeString()
	if err != nil {
		return e, err
	}
	e.Kind = kindOf(tag)
	fields := fieldOrder[e.Kind]
	for i := 1; i < n; i++ {
		if i-1 < len(fields) {
			err = decodeField(d, &e, fields[i-1])
		} else {
			err = d.Skip()
		}
		if err != nil {
			return e, err
		}
	}
	return e, nil
}

func decodeField(d *msgpack.Decoder, e *Event, name string) error {
	switch name {
	case "block_hashes":
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		e.Hashes = make([]uint64, 0, max(n, 0))
		for i := 0; i < n; i++ {
			h, ok, err := decodeHash(d)
			if err != nil {
				return err
			}
			if !ok {
				return errFormat
			}
			e.Hashes = append(e.Hashes, h)
		}
	case "parent_block_hash":
		h, ok, err := decodeHash(d)
		if err != nil {
			return err
		}
		e.Parent, e.HasParent = h, ok
	case "token_ids":
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		e.Tokens = make([]uint32, 0, max(n, 0))
		for i := 0; i < n; i++ {
			t, err := d.DecodeUint64()
			if err != nil {
				return err
			}
			e.Tokens = append(e.Tokens, uint32(t))
		}
	case "block_size":
		n, err := d.DecodeInt64()
		if err != nil {
			return err
		}
		e.BlockSize = int(n)
	default:
		return d.Skip()
	}
	return nil
}

// decodeHash reads a block hash: an integer, a byte string (folded to 64
// bits), or nil (ok false).
func decodeHash(d *msgpack.Decoder) (h uint64, ok bool, err error) {
	code, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case code == msgpcode.Nil:
		return 0, false, d.DecodeNil()
	case msgpcode.IsBin(code) || msgpcode.IsString(code):
		b, err := d.DecodeBytes()
		return xxhash.Sum64(b), err == nil, err
	default:
		h, err := d.DecodeUint64() // a negative int keeps its 64 bits
		return h, err == nil, err
	}
}

// AppendBatch appends b encoded as vLLM's array_like structs do (the form
// llm-d's reader expects): [ts, [events...], 0], each event tag first.
func AppendBatch(dst []byte, b Batch) []byte {
	w := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(w)
	_ = e.EncodeArrayLen(3)
	_ = e.EncodeFloat64(b.TS)
	_ = e.EncodeArrayLen(len(b.Events))
	for _, ev := range b.Events {
		switch ev.Kind {
		case BlockStored:
			_ = e.EncodeArrayLen(7)
			_ = e.EncodeString("BlockStored")
			encodeHashes(e, ev.Hashes)
			if ev.HasParent {
				_ = e.EncodeUint(ev.Parent)
			} else {
				_ = e.EncodeNil()
			}
			_ = e.EncodeArrayLen(len(ev.Tokens))
			for _, t := range ev.Tokens {
				_ = e.EncodeUint(uint64(t))
			}
			_ = e.EncodeInt(int64(ev.BlockSize))
			_ = e.EncodeNil() // lora_id
			_ = e.EncodeString("GPU")
		case BlockRemoved:
			_ = e.EncodeArrayLen(3)
			_ = e.EncodeString("BlockRemoved")
			encodeHashes(e, ev.Hashes)
			_ = e.EncodeString("GPU")
		default:
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeString("AllBlocksCleared")
		}
	}
	_ = e.EncodeInt(0) // data_parallel_rank
	return w.Bytes()
}

func encodeHashes(e *msgpack.Encoder, hs []uint64) {
	_ = e.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = e.EncodeUint(h)
	}
}
