package lua

import (
	"io/fs"
	"strings"
	"testing"
)

// TestSource: every script is sent as lib.lua then its file, and each file
// states its protocol in a header comment.
func TestSource(t *testing.T) {
	names, err := fs.Glob(Files, "*.lua")
	if err != nil || len(names) < 10 {
		t.Fatalf("Files holds %v (%v), want the ten scripts", names, err)
	}
	lib, _ := fs.ReadFile(Files, "lib.lua")
	for _, name := range names {
		src, err := Source(name)
		body, _ := fs.ReadFile(Files, name)
		if err != nil || src != string(lib)+"\n"+string(body) {
			t.Errorf("Source(%q) is not lib.lua then the file (%v)", name, err)
		}
		if !strings.HasPrefix(string(body), "-- "+name) {
			t.Errorf("%s does not open with its header (-- %s: ...)", name, name)
		}
	}
	if _, err := Source("missing.lua"); err == nil {
		t.Error("Source(missing.lua) = nil error")
	}
}
