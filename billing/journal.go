package billing

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/storefail"
)

// The charge journal (docs/billing.md, "The charge journal"). A settle whose
// cost is within its hold knows its charge before it is written (the hold
// covers it), so its response need not wait for the database's commit, only
// for the charge to be somewhere a crash of this process cannot take it
// from. That place is a file of fixed slots mapped into memory (MAP_SHARED):
// a store into it is a store into the kernel's page cache, which outlives
// the process, so writing a record costs a copy and no system call. Once its
// batch is durable in the database, the record's slot is cleared and reused.
//
// A process that dies leaves its journal behind; every instance looks for
// such journals (a file nobody holds the lock of) when it starts and at each
// sweep, applies their records (each a settle or a charge, idempotent by hold
// id: one already in the ledger changes nothing) and deletes them. What the
// journal does not cover is the machine itself losing power or crashing in
// the few milliseconds before the charge's batch is synced: the page cache
// goes with it. billing.journal: off keeps every response waiting for its
// durable commit instead.
//
// Slot layout: an 8-byte header (payload length in the low 32 bits, its
// CRC-32C in the high 32, written last, with one atomic store, in the
// machine's byte order: the file is read only on the machine that wrote it),
// then the payload (encodeRecord). A zero header is an empty slot. A record
// too long for a slot (names of several hundred bytes) is not journaled: its
// settle waits for the commit.

const (
	journalSlot   = 512
	journalSlots  = 2048 // 1 MiB: at 20,000 charges/s, 100 ms of charges not yet committed
	journalExt    = ".journal"
	journalTmpExt = ".journal-tmp"
	// journalVersion is the version of the records written. Version 1
	// records (written before charges had search fees) end after the
	// estimated flag; decodeRecord still reads them, as charges with no
	// search, so a journal left by the previous version is recovered.
	journalVersion = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// journal is this instance's journal file, mapped into memory.
type journal struct {
	path string
	mem  []byte        // the mapped file: journalSlots slots of journalSlot bytes
	busy []atomic.Bool // slot holds a record not yet durable in the database
	next atomic.Uint64
	file journalFile // the open, locked file (journal_unix.go)
	// closed: put writes nothing more. writers counts the puts in progress,
	// so that close unmaps the file only once none can touch it (a settle
	// that races the Biller's Close must not write into unmapped memory).
	closed  atomic.Bool
	writers atomic.Int64
}

// errJournalUnsupported: no journal on this platform (journal_other.go).
var errJournalUnsupported = errors.New("billing: the charge journal needs a unix system")

// openJournal creates this instance's journal in dir.
func openJournal(dir, instance string) (*journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("billing journal: %w", err)
	}
	j := &journal{path: filepath.Join(dir, instance+journalExt), busy: make([]atomic.Bool, journalSlots)}
	// A journal of this instance id already there is a dead run's (an
	// operator's fixed Options.Instance): moved aside for recovery, never
	// overwritten; one whose process lives means the id is in use.
	if f, ok, err := lockIfDead(j.path); err != nil {
		return nil, fmt.Errorf("billing journal: %w", err)
	} else if ok {
		err := os.Rename(j.path, filepath.Join(dir, instance+"-"+tollgate.NewID("dead_")+journalExt))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("billing journal: %w", err)
		}
	} else if _, err := os.Stat(j.path); err == nil {
		return nil, fmt.Errorf("billing journal: %s is locked by a running process: instance id %q is in use", j.path, instance)
	}
	var err error
	// Created under a name recovery ignores, locked, then renamed: another
	// instance never takes a journal being created for a dead one's.
	if j.file, j.mem, err = createMapped(filepath.Join(dir, instance+journalTmpExt), j.path, journalSlots*journalSlot); err != nil {
		return nil, fmt.Errorf("billing journal: %w", err)
	}
	return j, nil
}

// put writes op's record and returns its slot, or false if it was not
// written (every slot tried was in use, or the record is too long): the
// settle must then wait for its commit.
func (j *journal) put(op *tollgate.BillingOp) (int, bool) {
	j.writers.Add(1)
	defer j.writers.Add(-1)
	if j.closed.Load() {
		return 0, false
	}
	for range 4 {
		i := int(j.next.Add(1) % journalSlots)
		if !j.busy[i].CompareAndSwap(false, true) {
			continue
		}
		s := j.mem[i*journalSlot : (i+1)*journalSlot]
		n, ok := encodeRecord(s[8:], op)
		if !ok {
			j.busy[i].Store(false)
			return 0, false
		}
		hdr := uint64(n) | uint64(crc32.Checksum(s[8:8+n], castagnoli))<<32
		atomic.StoreUint64(slotHeader(s), hdr)
		return i, true
	}
	return 0, false
}

// done clears slot i: its record is durable in the database. After close
// it does nothing (the mapping may be gone).
func (j *journal) done(i int) {
	j.writers.Add(1)
	defer j.writers.Add(-1)
	if j.closed.Load() {
		return
	}
	atomic.StoreUint64(slotHeader(j.mem[i*journalSlot:]), 0)
	j.busy[i].Store(false)
}

// sync writes the journal's dirty pages to disk (fsync of the file, which
// covers the stores made through the mapping).
func (j *journal) sync() error {
	j.writers.Add(1)
	defer j.writers.Add(-1)
	if j.closed.Load() {
		return nil
	}
	return j.file.Sync()
}

// pending counts the slots in use.
func (j *journal) pending() int {
	n := 0
	for i := range j.busy {
		if j.busy[i].Load() {
			n++
		}
	}
	return n
}

// close unmaps the journal and deletes it if it holds no record; else it is
// left for recovery (its records' batches failed), and close says so. It
// runs once; later calls report nothing.
func (j *journal) close() (left int, err error) {
	if j.closed.Swap(true) {
		return 0, nil
	}
	for j.writers.Load() != 0 {
		runtime.Gosched() // a put that began before closed was set
	}
	left = j.pending()
	if left == 0 {
		err = os.Remove(j.path)
	}
	if cerr := unmapClose(j.file, j.mem); err == nil {
		err = cerr
	}
	return left, err
}

// encodeRecord writes op's record into b: version, kind, then the strings
// and numbers of the operation and its charge (version 2: the searches and
// the search price last). It reports the length, or
// false if b is too short.
func encodeRecord(b []byte, op *tollgate.BillingOp) (int, bool) {
	w := recWriter{b: b, ok: len(b) >= 2}
	if !w.ok {
		return 0, false
	}
	b[0], b[1], w.n = journalVersion, byte(op.Kind), 2
	c := &op.Charge
	for _, s := range [...]string{op.HoldID, op.Reservation, c.RequestID, c.AccountID, c.KeyID, c.Model, string(c.Class), c.Node} {
		w.str(s)
	}
	est := int64(0) // bit 0: estimated; bit 1: provisional
	if c.Estimated {
		est = 1
	}
	if op.Provisional {
		est |= 2
	}
	for _, v := range [...]int64{int64(op.Covered), int64(op.Return), c.PromptTokens, c.CompletionTokens, c.CachedTokens,
		c.ReasoningTokens, int64(c.Prices.Input), int64(c.Prices.Output), int64(c.Cost), c.Time.UnixNano(), est,
		c.Searches, int64(c.SearchPrice)} {
		w.varint(v)
	}
	return w.n, w.ok
}

// recWriter appends into a fixed buffer; ok turns false when it is full.
type recWriter struct {
	b  []byte
	n  int
	ok bool
}

func (w *recWriter) varint(v int64) {
	if !w.ok || len(w.b)-w.n < binary.MaxVarintLen64 {
		w.ok = false
		return
	}
	w.n += binary.PutVarint(w.b[w.n:], v)
}

func (w *recWriter) str(s string) {
	w.varint(int64(len(s)))
	if !w.ok || len(w.b)-w.n < len(s) {
		w.ok = false
		return
	}
	w.n += copy(w.b[w.n:], s)
}

// decodeRecord reads a record written by encodeRecord, of this version or
// version 1.
func decodeRecord(b []byte) (*tollgate.BillingOp, error) {
	if len(b) < 2 || (b[0] != journalVersion && b[0] != 1) {
		return nil, errors.New("unknown record version")
	}
	op := &tollgate.BillingOp{Kind: tollgate.BillingOpKind(b[1])}
	if op.Kind != tollgate.OpSettle && op.Kind != tollgate.OpCharge {
		return nil, fmt.Errorf("unknown operation %d", b[1])
	}
	r := recReader{b: b, n: 2}
	c := &op.Charge
	var class string
	for _, s := range [...]*string{&op.HoldID, &op.Reservation, &c.RequestID, &c.AccountID, &c.KeyID, &c.Model, &class, &c.Node} {
		*s = r.str()
	}
	c.Class = tollgate.BackendClass(class)
	var covered, ret, in, out, cost, at, est int64
	for _, v := range [...]*int64{&covered, &ret, &c.PromptTokens, &c.CompletionTokens, &c.CachedTokens,
		&c.ReasoningTokens, &in, &out, &cost, &at, &est} {
		*v = r.varint()
	}
	var price int64
	if b[0] >= 2 {
		c.Searches, price = r.varint(), r.varint()
	}
	if r.err != nil {
		return nil, r.err
	}
	if r.n != len(b) {
		return nil, errors.New("trailing bytes")
	}
	op.Covered, op.Return = tollgate.Amount(covered), tollgate.Amount(ret)
	c.Prices = tollgate.Prices{Input: tollgate.Rate(in), Output: tollgate.Rate(out)}
	if est < 0 || est > 3 {
		return nil, errors.New("bad flags")
	}
	c.Cost, c.Time, c.Estimated, op.Provisional = tollgate.Amount(cost), time.Unix(0, at).UTC(), est&1 != 0, est&2 != 0
	c.SearchPrice = tollgate.Amount(price)
	if op.HoldID == "" || c.Cost < 0 || c.Searches < 0 || c.SearchPrice < 0 {
		return nil, errors.New("a record without a hold or with a negative cost")
	}
	return op, nil
}

type recReader struct {
	b   []byte
	n   int
	err error
}

func (r *recReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Varint(r.b[r.n:])
	if k <= 0 {
		r.err = errors.New("bad number")
		return 0
	}
	r.n += k
	return v
}

func (r *recReader) str() string {
	l := r.varint()
	if r.err != nil {
		return ""
	}
	if l < 0 || l > int64(len(r.b)-r.n) {
		r.err = errors.New("bad string length")
		return ""
	}
	s := string(r.b[r.n : r.n+int(l)])
	r.n += int(l)
	return s
}

// journalRecord is a record found in a journal file, at its slot.
type journalRecord struct {
	slot int
	op   *tollgate.BillingOp
}

// readJournal returns the records of a journal file's content. A slot whose
// header is set but whose payload does not match it (a record cut short by a
// crash of the machine) is skipped and counted in bad.
func readJournal(data []byte) (recs []journalRecord, bad int) {
	for i := 0; (i+1)*journalSlot <= len(data); i++ {
		s := data[i*journalSlot : (i+1)*journalSlot]
		hdr := binary.NativeEndian.Uint64(s)
		if hdr == 0 {
			continue
		}
		n := int(uint32(hdr))
		if n > journalSlot-8 || crc32.Checksum(s[8:8+n], castagnoli) != uint32(hdr>>32) {
			bad++
			continue
		}
		op, err := decodeRecord(s[8 : 8+n])
		if err != nil {
			bad++
			continue
		}
		recs = append(recs, journalRecord{slot: i, op: op})
	}
	return recs, bad
}

// RecoverJournals applies the records of journals that dead processes left
// in the journal directory and deletes them. It is called at Run's start and
// at every sweep; a journal whose owner still runs (holds its lock) is left
// alone. It returns how many charges it applied (replays of charges already
// in the ledger included).
func (b *Biller) RecoverJournals(ctx context.Context) (int, error) {
	dir := b.opts.Journal
	if dir == "" {
		return 0, nil
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("billing journal: %w", err)
	}
	mine := ""
	if b.jnl != nil {
		mine = b.jnl.path
	}
	total := 0
	var errs []error
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(dir, name)
		if path == mine || e.IsDir() {
			continue
		}
		switch {
		case strings.HasSuffix(name, journalTmpExt):
			// A journal that was being created when its process died: it
			// holds nothing. One younger than a minute may be being
			// created right now, not yet locked: left alone.
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
				continue
			}
			if f, ok, err := lockIfDead(path); err == nil && ok {
				os.Remove(path)
				f.Close()
			}
		case strings.HasSuffix(name, journalExt):
			n, err := b.recoverJournal(ctx, path)
			total += n
			if err != nil {
				errs = append(errs, err)
				// An outage of the store is waited out, however long:
				// only records the store refuses count towards setting
				// the journal aside.
				if _, outage := storefail.Op(err); !outage {
					b.journalFailed(path)
				}
			}
		}
	}
	return total, errors.Join(errs...)
}

// maxJournalFailures: after this many failed recoveries in a row, a journal
// is renamed *.journal-failed (kept for the operator, no longer applied):
// a record the database will never take must not hold up the sweep of
// expired holds at every start.
const maxJournalFailures = 10

const journalFailedExt = ".journal-failed"

// journalFailed counts a failed recovery of the journal at path and sets it
// aside after maxJournalFailures.
func (b *Biller) journalFailed(path string) {
	b.failedMu.Lock()
	if b.recoverFails == nil {
		b.recoverFails = map[string]int{}
	}
	b.recoverFails[path]++
	n := b.recoverFails[path]
	if n >= maxJournalFailures {
		delete(b.recoverFails, path)
	}
	b.failedMu.Unlock()
	if n < maxJournalFailures {
		return
	}
	aside := strings.TrimSuffix(path, journalExt) + journalFailedExt
	if err := os.Rename(path, aside); err != nil {
		b.log.Error("set aside a charge journal that cannot be applied", "journal", path, "err", err)
		return
	}
	b.log.Error("a dead instance's charge journal could not be applied after repeated tries; it is set aside for the operator and no longer holds up the sweep",
		"journal", aside, "tries", n)
}

// recoverJournal applies the records of one journal, if its owner is dead.
func (b *Biller) recoverJournal(ctx context.Context, path string) (int, error) {
	f, ok, err := lockIfDead(path)
	if err != nil || !ok {
		return 0, err
	}
	defer f.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("billing journal %s: %w", path, err)
	}
	recs, bad := readJournal(data)
	recs = finalRecords(recs)
	if bad > 0 {
		b.log.Error("a dead instance's charge journal has damaged records; they are skipped", "journal", path, "records", bad)
	}
	applied, failed := 0, 0
	zero := make([]byte, 8)
	for len(recs) > 0 {
		chunk := recs[:min(len(recs), 256)]
		ops := make([]*tollgate.BillingOp, len(chunk))
		for i, r := range chunk {
			r.op.Recovered = true
			ops[i] = r.op
		}
		err := b.st.ApplyBilling(ctx, ops)
		b.storeAnswered(err)
		if storefail.Unavailable(err) {
			// The store is away: everything left waits for the next pass
			// (a record applied meanwhile is recognised by its hold id).
			return applied, storefail.Wrap("billing_recover",
				fmt.Errorf("billing journal %s: %d charges wait for the store: %w", path, len(recs), err))
		} else if err != nil {
			// One at a time: only a bad record stays.
			for i, r := range chunk {
				if err := b.st.ApplyBilling(ctx, ops[i:i+1]); storefail.Unavailable(err) {
					return applied, storefail.Wrap("billing_recover",
						fmt.Errorf("billing journal %s: charges wait for the store: %w", path, err))
				} else if err != nil {
					failed++
					b.log.Error("a dead instance's journaled charge could not be applied; it stays in the journal",
						"journal", path, "request_id", r.op.Charge.RequestID, "hold", r.op.HoldID, "err", err)
					continue
				}
				b.recovered(r.op)
				applied++
				f.WriteAt(zero, int64(r.slot*journalSlot)) // applied: never again
			}
			recs = recs[len(chunk):]
			continue
		}
		recs = recs[len(chunk):]
		for _, r := range chunk {
			b.recovered(r.op)
			applied++
		}
	}
	if failed > 0 {
		return applied, fmt.Errorf("billing journal %s: %d charges could not be applied", path, failed)
	}
	if err := os.Remove(path); err != nil {
		return applied, fmt.Errorf("billing journal: %w", err)
	}
	b.log.Info("applied the charge journal of a dead instance", "journal", path, "charges", applied)
	return applied, nil
}

// finalRecords drops the provisional records that another record of the
// same hold supersedes: its settle (written before the provisional record's
// slot was cleared), or a later provisional record with more delivered
// (written before the earlier one's slot was cleared).
func finalRecords(recs []journalRecord) []journalRecord {
	keep := make([]bool, len(recs))
	final := map[string]bool{}
	prov := map[string]int{} // hold id → its provisional record with the most delivered
	for i, r := range recs {
		if !r.op.Provisional {
			keep[i], final[r.op.HoldID] = true, true
			continue
		}
		if j, ok := prov[r.op.HoldID]; !ok || r.op.Charge.Cost > recs[j].op.Charge.Cost {
			prov[r.op.HoldID] = i
		}
	}
	for hold, i := range prov {
		if !final[hold] {
			keep[i] = true
		}
	}
	out := recs[:0:0]
	for i, r := range recs {
		if keep[i] {
			out = append(out, r)
		}
	}
	return out
}

// recovered logs and counts a journaled charge applied by recovery.
func (b *Biller) recovered(op *tollgate.BillingOp) {
	if op.Replayed {
		return // it had been committed before its process died
	}
	b.journalRecovered.Add(1)
	b.log.Warn("charged a request from a dead instance's journal", "request_id", op.Charge.RequestID,
		"account", op.Charge.AccountID, "charged", op.Charged.String(), "uncollected", op.Uncollected.String())
}

// keepJournaled keeps a journaled operation whose batch failed for
// RetryJournaled. Its record stays in the journal (so a crash before the
// retry loses nothing) and its money stays held: in its hold row, or as
// pending in its reservation.
func (b *Biller) keepJournaled(p *pending) {
	b.log.Error("a charge already answered could not be committed; it is retried as soon as the store answers, and applied from the journal if this process ends first",
		"request_id", p.op.Charge.RequestID, "hold", p.op.HoldID, "cost", p.op.Charge.Cost.String(), "err", p.err)
	b.failedMu.Lock()
	b.failed = append(b.failed, p)
	b.failedMu.Unlock()
	// It may now wait minutes for the database: put it on disk, so that
	// a power loss does not take it either.
	if err := b.jnl.sync(); err != nil {
		b.log.Error("sync the charge journal", "journal", b.jnl.path, "err", err)
	}
}

// RetryJournaled applies again the journaled operations whose batch failed,
// each alone with the store's check for an earlier charge of its hold, and
// returns how many went in; the others are kept for the next call.
func (b *Biller) RetryJournaled(ctx context.Context) int {
	b.failedMu.Lock()
	fs := b.failed
	b.failed = nil
	b.failedMu.Unlock()
	var keep []*pending
	for i, p := range fs {
		op := &p.op
		op.Recovered = true
		err := b.st.ApplyBilling(ctx, []*tollgate.BillingOp{op})
		b.storeAnswered(err)
		if err != nil {
			// The database still refuses: the rest waits for the next
			// pass rather than each wait out a busy timeout now.
			p.err = err
			keep = append(keep, fs[i:]...)
			break
		}
		p.err = nil
		paidBefore(p)
		b.finish(p)
		b.journalDone(p)
	}
	if len(keep) > 0 {
		b.log.Error("charges already answered still cannot be committed", "charges", len(keep), "err", keep[0].err)
		b.failedMu.Lock()
		b.failed = append(b.failed, keep...)
		b.failedMu.Unlock()
	}
	return len(fs) - len(keep)
}
