package tierlimit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tierlimit/tierlimit"
)

// TestMisconfigured holds Misconfigured to every reply form it documents,
// wrapped the ways the tiers wrap them, and to the errors it must not
// claim: an outage, a timeout, a script error, a busy server.
func TestMisconfigured(t *testing.T) {
	reply := errors.New // what go-redis returns for an error reply has its text
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"NOAUTH", reply("NOAUTH Authentication required."), true},
		{"WRONGPASS", reply("WRONGPASS invalid username-password pair or user is disabled."), true},
		{"ERR AUTH", reply("ERR AUTH <password> called without any password configured for the default user."), true},
		{"ERR Client sent AUTH", reply("ERR Client sent AUTH, but no password is set"), true},
		{"unauthenticated long command", reply("ERR Protocol error: unauthenticated multibulk length"), true},
		{"unauthenticated bulk", reply("ERR Protocol error: unauthenticated bulk length"), true},
		{"NOPERM command", reply("NOPERM User u has no permissions to run the 'evalsha' command"), true},
		{"NOPERM key", reply("NOPERM No permissions to access a key"), true},
		{"renamed EVALSHA", reply("ERR unknown command 'evalsha', with args beginning with: "), true},
		{"renamed SCRIPT subcommand", reply("ERR unknown subcommand 'load'. Try SCRIPT HELP."), true},
		{"replica", reply("READONLY You can't write against a read only replica."), true},
		{"noeviction full", reply("OOM command not allowed when used memory > 'maxmemory'."), true},
		{"ErrMisconfigured", fmt.Errorf("hybrid: %w", tierlimit.ErrMisconfigured), true},
		{"wrapped once", fmt.Errorf("remote: tb: %w", reply("NOPERM No permissions to access a key")), true},
		{"wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", reply("NOAUTH Authentication required."))), true},
		{"beside another (%w %w)", fmt.Errorf("hybrid: %w: %w", context.DeadlineExceeded, reply("READONLY You can't write against a read only replica.")), true},
		{"joined", errors.Join(errors.New("refund 3 to \"a\": i/o timeout"), reply("OOM command not allowed")), true},
		{"down", errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"), false},
		{"timeout", fmt.Errorf("claim: %w", context.DeadlineExceeded), false},
		{"script error", reply("ERR user_script:12: attempt to compare nil with number"), false},
		{"busy", reply("BUSY Redis is busy running a script."), false},
		{"loading", reply("LOADING Redis is loading the dataset in memory"), false},
		{"no script", reply("NOSCRIPT No matching script. Please use EVAL."), false},
		{"prefix inside the text only", errors.New("remote: the key NOPERM_x was denied"), false},
	}
	for _, tc := range tests {
		if got := tierlimit.Misconfigured(tc.err); got != tc.want {
			t.Errorf("Misconfigured(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
