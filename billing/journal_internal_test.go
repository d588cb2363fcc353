package billing

import (
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

func sampleOp() *tollgate.BillingOp {
	return &tollgate.BillingOp{Kind: tollgate.OpCharge, HoldID: "hold_01", Reservation: "rsv_02", Covered: 1234567, Return: 89,
		Charge: tollgate.Charge{RequestID: "req_abc", AccountID: "acct_1", KeyID: "key_1", Model: "meta-llama/Llama-3.1-8B-Instruct",
			Class: tollgate.ClassFallback, Node: "http://10.0.0.7:8000", PromptTokens: 1 << 40, CompletionTokens: 17,
			CachedTokens: 3, ReasoningTokens: 9, Prices: tollgate.Prices{Input: 150000, Output: 600000}, Cost: 98765432101,
			Estimated: true, Time: time.Date(2026, 11, 24, 23, 59, 1, 123456789, time.UTC)}}
}

// sampleSearchOp is sampleOp with web searches: 4 at 0.005 USD each.
func sampleSearchOp() *tollgate.BillingOp {
	op := sampleOp()
	op.Charge.Searches, op.Charge.SearchPrice = 4, tollgate.MustParseAmount("0.005")
	op.Charge.Cost += 4 * tollgate.MustParseAmount("0.005")
	return op
}

// sampleOpV1 is sampleOp as the previous version's encoder wrote it
// (record version 1, no search fields).
const sampleOpV1 = "01060e686f6c645f30310c7273765f30320e7265715f6162630c616363745f310a6b65795f31406d6574612d6c6c616d612f4c6c" +
	"616d612d332e312d38422d496e7374727563741066616c6c6261636b28687474703a2f2f31302e302e302e373a383030308eda9601b2" +
	"01808080808040220612e0a712809f49ca9487eedf05aafc89decca790eb3102"

// A journal left by the previous version (version 1 records) is still
// recovered: its records read as charges with no search.
func TestJournalRecordVersion1(t *testing.T) {
	b, err := hex.DecodeString(sampleOpV1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRecord(b)
	if err != nil {
		t.Fatalf("a version 1 record: %v", err)
	}
	if !reflect.DeepEqual(got, sampleOp()) {
		t.Errorf("version 1 record:\n got %+v\nwant %+v", got, sampleOp())
	}
	// An unknown version is refused, not misread.
	b[0] = journalVersion + 1
	if _, err := decodeRecord(b); err == nil {
		t.Error("a record of an unknown version was read")
	}
}

func TestJournalRecordRoundTrip(t *testing.T) {
	provisional := sampleOp()
	provisional.Provisional = true
	for _, op := range []*tollgate.BillingOp{sampleOp(), sampleSearchOp(), provisional, {Kind: tollgate.OpSettle, HoldID: "h", Charge: tollgate.Charge{Time: time.Unix(0, 0).UTC()}}} {
		buf := make([]byte, journalSlot-8)
		n, ok := encodeRecord(buf, op)
		if !ok {
			t.Fatalf("encode %+v: too long", op)
		}
		got, err := decodeRecord(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, op) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, op)
		}
	}
}

// A record that does not fit a slot is refused whole, and its slot is free
// again: the settle then waits for its commit.
func TestJournalRefusesARecordTooLong(t *testing.T) {
	j, err := openJournal(t.TempDir(), "inst_long")
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	op := sampleOp()
	op.Charge.Model = strings.Repeat("m", journalSlot)
	if _, ok := j.put(op); ok {
		t.Fatal("a record longer than a slot was written")
	}
	if n := j.pending(); n != 0 {
		t.Errorf("%d slots in use after a refused record", n)
	}
	i, ok := j.put(sampleOp())
	if !ok || j.pending() != 1 {
		t.Fatalf("a normal record: %v, %d pending", ok, j.pending())
	}
	recs, bad := readJournal(j.mem)
	if len(recs) != 1 || bad != 0 || recs[0].slot != i || !reflect.DeepEqual(recs[0].op, sampleOp()) {
		t.Errorf("the mapped file holds %+v (%d bad)", recs, bad)
	}
	j.done(i)
	if recs, _ := readJournal(j.mem); len(recs) != 0 || j.pending() != 0 {
		t.Errorf("after done: %d records, %d pending", len(recs), j.pending())
	}
}

// Slots that were never written are empty; a slot whose payload does not
// match its header (a machine crash mid-record) is skipped and counted.
func TestReadJournalSkipsDamagedSlots(t *testing.T) {
	data := make([]byte, 4*journalSlot)
	put := func(slot int, op *tollgate.BillingOp) {
		s := data[slot*journalSlot:]
		n, ok := encodeRecord(s[8:journalSlot], op)
		if !ok {
			t.Fatal("encode")
		}
		binary.NativeEndian.PutUint64(s, uint64(n)|uint64(crc32.Checksum(s[8:8+n], castagnoli))<<32)
	}
	a, b := sampleOp(), sampleOp()
	b.HoldID = "hold_other"
	put(0, a)
	put(2, a)
	data[2*journalSlot+20] ^= 0xff // torn
	put(3, b)
	recs, bad := readJournal(data)
	if bad != 1 || len(recs) != 2 || recs[0].slot != 0 || recs[1].slot != 3 || recs[1].op.HoldID != "hold_other" {
		t.Errorf("read %+v, %d bad; want slots 0 and 3, 1 bad", recs, bad)
	}
}

// Whatever a journal holds, reading it never panics, and what decodes
// encodes back to the same record.
func FuzzJournalRecord(f *testing.F) {
	buf := make([]byte, journalSlot-8)
	n, _ := encodeRecord(buf, sampleOp())
	f.Add(buf[:n])
	n, _ = encodeRecord(buf, sampleSearchOp())
	f.Add(buf[:n])
	v1, _ := hex.DecodeString(sampleOpV1)
	f.Add(v1)
	f.Add([]byte{1, 2, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		op, err := decodeRecord(b)
		if err != nil {
			return
		}
		out := make([]byte, journalSlot-8)
		n, ok := encodeRecord(out, op)
		if !ok {
			return // decodable but longer than a slot: never written
		}
		again, err := decodeRecord(out[:n])
		if err != nil || !reflect.DeepEqual(again, op) {
			t.Fatalf("re-encoded %+v: %+v, %v", op, again, err)
		}
	})
}

// Recovery applies a hold's settle over its provisional records, and of
// provisional records alone the one with the most delivered.
func TestFinalRecords(t *testing.T) {
	rec := func(slot int, hold string, cost tollgate.Amount, provisional bool) journalRecord {
		return journalRecord{slot: slot, op: &tollgate.BillingOp{Kind: tollgate.OpSettle, HoldID: hold, Provisional: provisional,
			Charge: tollgate.Charge{Cost: cost}}}
	}
	recs := []journalRecord{
		rec(0, "h1", 1, true), rec(1, "h1", 4, false), rec(2, "h1", 2, true), // settled: its settle
		rec(3, "h2", 3, true), rec(4, "h2", 5, true), // cut: the latest progress
		rec(5, "h3", 7, false), // settled, no progress
	}
	got := finalRecords(recs)
	var slots []int
	for _, r := range got {
		slots = append(slots, r.slot)
	}
	if !reflect.DeepEqual(slots, []int{1, 4, 5}) {
		t.Errorf("records applied: slots %v, want [1 4 5]", slots)
	}
}
