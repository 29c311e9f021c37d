package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/local"
)

// failingConc is a concurrency limiter whose every call fails.
type failingConc struct{}

func (failingConc) Acquire(context.Context, string) (tierlimit.Permit, error) {
	return tierlimit.Permit{}, errors.New("backend down")
}
func (failingConc) TryAcquire(context.Context, string) (tierlimit.Permit, bool, error) {
	return tierlimit.Permit{}, false, errors.New("backend down")
}

func TestWithConcurrency(t *testing.T) {
	conc, err := local.NewConcurrency(1, local.WithPermitFunc(func(k string) int64 {
		if k == "bad" {
			return -2
		}
		return tierlimit.DefaultPermits
	}))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(newFake(tierlimit.PerSecond(1000), 0, 0), WithConcurrency(conc), WithKey(KeyHeader("K")))
	if err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan struct{}), make(chan struct{})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			inside <- struct{}{}
			<-release
		}
	}))
	get := func(path, key string) int {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("K", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	done := make(chan int)
	go func() { done <- get("/slow", "a") }()
	<-inside
	for _, tt := range []struct {
		key  string
		want int
	}{
		{"a", http.StatusTooManyRequests}, // a's one permit is held
		{"b", http.StatusOK},
		{"", http.StatusOK}, // exempt
		{"bad", http.StatusTooManyRequests},
	} {
		if got := get("/", tt.key); got != tt.want {
			t.Errorf("GET key %q while a is in flight = %d, want %d", tt.key, got, tt.want)
		}
	}
	close(release)
	if got := <-done; got != http.StatusOK {
		t.Errorf("the slow request = %d, want 200", got)
	}
	if got := get("/", "a"); got != http.StatusOK {
		t.Errorf("GET key a after its request returned = %d, want 200: the permit was not released", got)
	}
	if s := conc.Stats(); s.InUse != 0 {
		t.Errorf("Stats().InUse = %d after every request returned, want 0", s.InUse)
	}

	for _, tt := range []struct {
		name string
		opts []Option
		want int
	}{
		{"fail open", nil, http.StatusOK},
		{"fail closed", []Option{WithFailClosed(nil)}, http.StatusServiceUnavailable},
	} {
		var reported error
		opts := append([]Option{WithConcurrency(failingConc{}), WithErrorFunc(func(_ *http.Request, err error) { reported = err })}, tt.opts...)
		m, err := New(newFake(tierlimit.PerSecond(1000), 0, 0), opts...)
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != tt.want || reported == nil {
			t.Errorf("%s: a failing concurrency limiter gives %d (reported %v), want %d and a report", tt.name, w.Code, reported, tt.want)
		}
	}
	if _, err := New(newFake(tierlimit.PerSecond(1), 0, 0), WithConcurrency(nil)); !errors.Is(err, tierlimit.ErrInvalidOption) {
		t.Errorf("New(WithConcurrency(nil)) = %v, want ErrInvalidOption", err)
	}
}
