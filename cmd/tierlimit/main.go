package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the command could not do its job, e.g. Redis unreachable
	exitUsage   = 2 // a bad command line
)

// A command runs with its arguments (after its name). It prints its help
// and returns errHelp for -h, and returns a usageError for a bad command
// line.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

var commands = map[string]command{
	"demo":    demo,
	"bench":   bench,
	"inspect": inspect,
}

const usage = `tierlimit shows and measures the rate limiters of github.com/tierlimit/tierlimit.

Usage:
  tierlimit demo [-duration 12s] [-plot FILE.png] [-redis URL]
        a simulated fleet on an embedded Redis: every strategy side by side,
        then a Redis outage
  tierlimit bench [-redis URL] [-rate N -period D -burst N] [-keys N -zipf S] ...
        the same measurements for your own Redis and limits, as a table or -json
  tierlimit inspect [-redis URL] [-prefix P] [-rate N -period D -burst N] KEY
        the state a key has in Redis

Run 'tierlimit COMMAND -h' for a command's flags.
`

// errHelp reports that a command printed its help.
var errHelp = errors.New("help printed")

// run runs the command line args and returns the exit status. Output goes
// to stdout; progress and errors, each error on one line, to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "tierlimit: unknown command %q (want demo, bench or inspect; see tierlimit -h)\n", name)
		return exitUsage
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	var usageErr usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &usageErr):
		fmt.Fprintf(stderr, "tierlimit %s: %s (see tierlimit %s -h)\n", name, oneLine(usageErr.msg), name)
		return exitUsage
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		fmt.Fprintf(stderr, "tierlimit %s: interrupted\n", name)
		return exitFailure
	default:
		fmt.Fprintf(stderr, "tierlimit %s: %s\n", name, oneLine(err.Error()))
		return exitFailure
	}
}

// newFlags returns the flag set of a command; parseFlags prints help
// with synopsis.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("tierlimit "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed on one line by run
	return fs
}

// parseFlags parses args. For -h it prints synopsis and the flags to stdout
// and returns errHelp; a bad flag is a usageError.
func parseFlags(fs *flag.FlagSet, args []string, synopsis string, stdout io.Writer) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "%s\n\nFlags:\n", strings.TrimSpace(synopsis))
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return errHelp
	}
	if err != nil {
		return usageError{err.Error()}
	}
	return nil
}
