package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// runCmd runs the command line args and returns its exit status and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// oneErrorLine checks that stderr is exactly one line starting with prefix.
func oneErrorLine(t *testing.T, args []string, stderr, prefix string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") || !strings.HasPrefix(stderr, prefix) {
		t.Errorf("run(%q): stderr = %q, want one line starting with %q", args, stderr, prefix)
	}
	if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
		t.Errorf("run(%q): stderr holds a stack trace: %q", args, stderr)
	}
}

func TestRunBadCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error line
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"demo", "-nope"}, "flag provided but not defined: -nope"},
		{[]string{"demo", "-duration", "1s"}, "-duration 1s must be between 2s and 1h"},
		{[]string{"demo", "-duration", "soon"}, `invalid value "soon" for flag -duration`},
		{[]string{"demo", "extra"}, `unexpected argument "extra"`},
		{[]string{"demo", "-plot", "chart.svg"}, "name it *.png"},
		{[]string{"demo", "-plot", "x.png", "-redis", "redis://127.0.0.1:6379/0"}, "-plot charts the outage"},
		{[]string{"demo", "-redis", "http://127.0.0.1:6379"}, "invalid URL scheme"},
		{[]string{"bench", "-zipf", "0.5"}, "-zipf 0.5 must be 0 (uniform)"},
		{[]string{"bench", "-keys", "0"}, "-keys 0 must be between 1 and"},
		{[]string{"bench", "-instances", "0"}, "-instances 0 must be between 1 and"},
		{[]string{"bench", "-concurrency", "100000"}, "-concurrency 100000 must be between 1 and"},
		{[]string{"bench", "-duration", "1ms"}, "-duration 1ms must be between"},
		{[]string{"bench", "-rate", "0"}, "rate 0 must be > 0"},
		{[]string{"bench", "-period", "1ns"}, "not a whole number of microseconds"},
		{[]string{"bench", "-strategies", "local,magic"}, `unknown strategy "magic"`},
		{[]string{"bench", "-strategies", "hybrid,hybrid"}, `"hybrid" given twice`},
		{[]string{"bench", "-json=maybe"}, "invalid boolean value"},
		{[]string{"inspect"}, "missing KEY"},
		{[]string{"inspect", "a", "b"}, `one KEY only, got another: "b"`},
		{[]string{"inspect", "-prefix", "x{", "k"}, `-prefix "x{"`},
		{[]string{"inspect", "-rate", "-5", "k"}, "rate -5 must be > 0"},
		{[]string{"inspect", strings.Repeat("k", 1025)}, "invalid key"},
		{[]string{"inspect", "k", "-redis", "tcp://x"}, "invalid URL scheme"},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != exitUsage {
			t.Errorf("run(%q) = %d, want %d", tc.args, code, exitUsage)
		}
		prefix := "tierlimit " + tc.args[0] + ": "
		if tc.args[0] == "frobnicate" {
			prefix = "tierlimit: "
		}
		oneErrorLine(t, tc.args, stderr, prefix)
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("run(%q): stderr = %q, want it to contain %q", tc.args, stderr, tc.want)
		}
		if stdout != "" {
			t.Errorf("run(%q): stdout = %q, want nothing", tc.args, stdout)
		}
	}
}

func TestRunHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"tierlimit demo", "tierlimit bench", "tierlimit inspect"}},
		{[]string{"demo", "-h"}, []string{"Usage: tierlimit demo", "-duration", "-plot", "-redis"}},
		{[]string{"bench", "-help"}, []string{"Usage: tierlimit bench", "-zipf", "-json", "-strategies", "-concurrency"}},
		{[]string{"inspect", "-h"}, []string{"Usage: tierlimit inspect", "-prefix", "-rate"}},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != exitOK || stderr != "" {
			t.Errorf("run(%q) = %d, stderr %q; want 0 and nothing", tc.args, code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("run(%q): help lacks %q:\n%s", tc.args, w, stdout)
			}
		}
	}
	if code, _, stderr := runCmd(t); code != exitUsage || !strings.Contains(stderr, "Usage:") {
		t.Errorf("run() = %d, stderr %q; want %d and the usage", code, stderr, exitUsage)
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestRunUnreachableRedis(t *testing.T) {
	url := "redis://" + closedPort(t) + "/0"
	for _, args := range [][]string{
		{"demo", "-redis", url},
		{"bench", "-redis", url, "-duration", "100ms"},
		{"inspect", "-redis", url, "user:42"},
	} {
		code, stdout, stderr := runCmd(t, args...)
		if code != exitFailure {
			t.Errorf("run(%q) = %d, want %d", args, code, exitFailure)
		}
		oneErrorLine(t, args, stderr, "tierlimit "+args[0]+": cannot reach Redis at redis://127.0.0.1:")
		if !strings.Contains(stderr, "connection refused") || stdout != "" {
			t.Errorf("run(%q): stdout %q, stderr %q; want nothing and the cause", args, stdout, stderr)
		}
	}
}

func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, 10*time.Second)
	defer p.stop()
	if p.tty {
		t.Fatal("a buffer taken for a terminal")
	}
	p.start = p.start.Add(-5 * time.Second)
	p.step("hybrid")
	if got, want := b.String(), "tierlimit:  50% hybrid\n"; got != want {
		t.Errorf("progress line = %q, want %q", got, want)
	}
	bar := p.bar(10)
	if !strings.HasPrefix(bar, "\r\x1b[K[█████░░░░░]  50%  hybrid") || !strings.HasSuffix(bar, "5s left") {
		t.Errorf("bar = %q, want half full, the step and 5s left", bar)
	}
}
