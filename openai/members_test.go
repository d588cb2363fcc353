package openai

import (
	"encoding/json"
	"testing"
)

func TestReplaceMembers(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[1],"temperature":0.5}`)
	out, ok := ReplaceMembers(nil, body, []Member{
		{Key: "messages", Value: []byte(`[]`)},
		{Key: "tools", Value: nil},
		{Key: "tool_choice", Value: []byte(`"auto"`)},
		{Key: "absent", Value: nil},
	})
	if !ok {
		t.Fatal("not ok")
	}
	want := `{"model":"m","messages":[],"temperature":0.5,"tool_choice":"auto"}`
	if string(out) != want {
		t.Fatalf("got %s\nwant %s", out, want)
	}
	if !json.Valid(out) {
		t.Fatal("invalid JSON")
	}
	if _, ok := ReplaceMembers(nil, []byte(`[1]`), nil); ok {
		t.Fatal("an array was accepted as an object")
	}
}
