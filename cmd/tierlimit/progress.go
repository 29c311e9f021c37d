package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress shows how far a run of known length is, on stderr: a bar
// redrawn in place when stderr is a terminal, otherwise one line per step
// (logs and CI keep them readable). It is safe for concurrent use.
type progress struct {
	w     io.Writer
	tty   bool
	total time.Duration
	start time.Time

	mu    sync.Mutex
	label string

	stopOnce sync.Once
	done     chan struct{}
	wg       sync.WaitGroup
}

// barRedraw is how often the terminal bar is redrawn.
const barRedraw = 100 * time.Millisecond

func newProgress(w io.Writer, total time.Duration) *progress {
	p := &progress{w: w, tty: isTerminal(w), total: total, start: time.Now(), done: make(chan struct{})}
	if p.tty {
		p.wg.Add(1)
		go p.redraw()
	}
	return p
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// step says what runs now.
func (p *progress) step(label string) {
	p.mu.Lock()
	p.label = label
	p.mu.Unlock()
	if !p.tty {
		fmt.Fprintf(p.w, "tierlimit: %3.0f%% %s\n", 100*p.fraction(), label)
	}
}

func (p *progress) fraction() float64 {
	return min(1, float64(time.Since(p.start))/float64(max(p.total, 1)))
}

func (p *progress) redraw() {
	defer p.wg.Done()
	t := time.NewTicker(barRedraw)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			fmt.Fprint(p.w, "\r\x1b[K") // erase the bar
			return
		case <-t.C:
			fmt.Fprint(p.w, p.bar(40))
		}
	}
}

// bar renders the bar, width cells wide, for redrawing in place.
func (p *progress) bar(width int) string {
	f := p.fraction()
	full := int(f * float64(width))
	left := (p.total - time.Since(p.start)).Round(time.Second)
	p.mu.Lock()
	label := p.label
	p.mu.Unlock()
	return fmt.Sprintf("\r\x1b[K[%s%s] %3.0f%%  %s  %v left", strings.Repeat("█", full),
		strings.Repeat("░", width-full), 100*f, label, max(left, 0))
}

// stop removes the bar. It is safe to call twice.
func (p *progress) stop() {
	p.stopOnce.Do(func() {
		close(p.done)
		p.wg.Wait()
	})
}
