package search

import (
	"context"
	"strings"
	"testing"
)

// The search loop's own work per search, without the provider's or the
// model's time: a cached search, its result text, and the annotations of
// a typical answer.
func BenchmarkServiceCacheHit(b *testing.B) {
	s := NewWith(&countingProvider{}, Config{})
	q := Query{Text: "go release history", Size: Medium}
	if _, err := s.Search(context.Background(), q); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Search(context.Background(), q); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFormatResults(b *testing.B) {
	s := NewWith(&countingProvider{}, Config{})
	res, err := s.Search(context.Background(), Query{Text: "q", Size: High})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		FormatResults("go release history", res, 1)
	}
}

func BenchmarkAnnotate(b *testing.B) {
	answer := strings.Repeat("Go 1.26 came out in February 🎉 [1], with changes described on "+
		"[Wikipedia](https://en.wikipedia.org/wiki/Go_(programming_language)) and at https://example.com/a. ", 20)
	b.SetBytes(int64(len(answer)))
	b.ReportAllocs()
	for b.Loop() {
		Annotate(answer, testSources)
	}
}
