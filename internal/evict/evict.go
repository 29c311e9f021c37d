// Package evict reads what Redis servers say about evicting keys and
// reports it for the limiters that keep their state there (remote, hybrid)
// and for the tierlimit command.
package evict

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/detach"
	"github.com/tierlimit/tierlimit/internal/logline"
)

// Every is how often a Watch reads the server again.
const Every = time.Minute

// retry is how soon a Watch tries again after failing to reach Redis.
const retry = 5 * time.Second

// NilClient reports whether rdb is nil: the nil interface, or a typed nil
// such as a nil *redis.Client, whose methods panic inside go-redis.
func NilClient(rdb redis.UniversalClient) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// errNilClient is Read's error for a nil client (NilClient).
var errNilClient = errors.New("evict: nil redis client")

// Read returns what every server behind rdb (each master of a Cluster, each
// shard of a Ring) says about eviction, from INFO (which managed Redis
// services allow where they refuse CONFIG). The first risky server
// decides; evicted keys are added up. A server that refuses INFO, or does
// not report its policy, makes the risk unknown (Err set). The error is
// non-nil only when a server could not be reached, or rdb is nil
// (NilClient): then nothing is known; or when the client's kind does not
// fit the server (a plain client on a Cluster node, a Cluster client on a
// standalone server): then it wraps tierlimit.ErrMisconfigured.
//
// Read returns by ctx's end, whatever the client's timeouts: a client that
// ignores the deadline (go-redis's default) goes on reading on a goroutine
// of its own, which ends when the client gives up.
func Read(ctx context.Context, rdb redis.UniversalClient) (tierlimit.EvictionRisk, error) {
	if NilClient(rdb) {
		return tierlimit.EvictionRisk{}, errNilClient
	}
	return detach.Call(detach.Honours(rdb), ctx, func(ctx context.Context) (tierlimit.EvictionRisk, error) { return read(ctx, rdb) })
}

// read is Read, as long as the client takes.
func read(ctx context.Context, rdb redis.UniversalClient) (tierlimit.EvictionRisk, error) {
	var (
		mu       sync.Mutex
		readings []tierlimit.EvictionRisk
	)
	read := func(ctx context.Context, c *redis.Client) error {
		r, err := readInfo(c.Info(ctx))
		mu.Lock()
		readings = append(readings, r)
		mu.Unlock()
		return err
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, read)
	case *redis.Ring:
		err = c.ForEachShard(ctx, read)
	default:
		cmd := rdb.Info(ctx)
		if strings.Contains(cmd.Val(), "cluster_enabled:1") {
			return tierlimit.EvictionRisk{}, fmt.Errorf("%w: a client for one server on a node of a Redis Cluster "+
				"(every key on another node would get MOVED): use redis.NewClusterClient", tierlimit.ErrMisconfigured)
		}
		var r tierlimit.EvictionRisk
		r, err = readInfo(cmd)
		readings = append(readings, r)
	}
	if err != nil {
		if strings.Contains(err.Error(), "cluster support disabled") {
			return tierlimit.EvictionRisk{}, fmt.Errorf("%w: a Redis Cluster client on a server that is not in a cluster: "+
				"use redis.NewClient (%w)", tierlimit.ErrMisconfigured, err)
		}
		return tierlimit.EvictionRisk{}, err
	}
	return merge(readings), nil
}

// merge makes one risk of several servers': the first risky one's, else the
// first unknown one's, else the first one's, with the evicted keys of all.
func merge(rs []tierlimit.EvictionRisk) tierlimit.EvictionRisk {
	var out tierlimit.EvictionRisk
	rank := func(r tierlimit.EvictionRisk) int {
		switch {
		case r.Risky():
			return 2
		case !r.Known():
			return 1
		}
		return 0
	}
	var evicted int64
	for i, r := range rs {
		evicted += r.EvictedKeys
		if i == 0 || rank(r) > rank(out) {
			out = r
		}
	}
	out.EvictedKeys = evicted
	return out
}

// readInfo turns an INFO reply into a risk; a Redis error reply makes the
// risk unknown, any other error is returned.
func readInfo(cmd *redis.StringCmd) (tierlimit.EvictionRisk, error) {
	text, err := cmd.Result()
	var reply redis.Error
	switch {
	case errors.As(err, &reply):
		return tierlimit.EvictionRisk{Err: fmt.Errorf("INFO refused: %w", err)}, nil
	case err != nil:
		return tierlimit.EvictionRisk{}, err
	}
	return Parse(text), nil
}

// Parse reads maxmemory, maxmemory_policy and evicted_keys from the text of
// INFO. A server that reports no maxmemory_policy (a Redis-compatible
// server without Redis's eviction, e.g. miniredis) is read as one that
// does not evict.
func Parse(info string) tierlimit.EvictionRisk {
	var r tierlimit.EvictionRisk
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch name {
		case "maxmemory":
			r.MaxMemory, _ = strconv.ParseInt(value, 10, 64)
		case "maxmemory_policy":
			r.Policy = value
		case "evicted_keys":
			r.EvictedKeys, _ = strconv.ParseInt(value, 10, 64)
		}
	}
	return r
}

// Watch follows a server's eviction settings for one limiter: it reads them
// when asked (Check), at most once per Every when polled (Due), reports
// every change to the observer and logs one line when they become risky or
// unknown. It is safe for concurrent use.
type Watch struct {
	rdb    redis.UniversalClient
	report func(tierlimit.EvictionRisk) // nil when not observed
	logger *slog.Logger                 // nil: slog.Default()
	next   atomic.Int64                 // unix ns before which Due is false
	polled atomic.Bool                  // a Due check is under way

	mu   sync.Mutex // guards last and have
	last tierlimit.EvictionRisk
	have bool
}

// errNotRead is the Err of a Watch's risk before its first check.
var errNotRead = errors.New("not read yet")

// NewWatch returns a Watch of rdb reporting to report (may be nil) and
// warning of a risk in logger (nil: slog.Default()).
func NewWatch(rdb redis.UniversalClient, report func(tierlimit.EvictionRisk), logger *slog.Logger) *Watch {
	return &Watch{rdb: rdb, report: report, logger: logger, last: tierlimit.EvictionRisk{Err: errNotRead}}
}

// Last returns the last reading: unknown before the first check, and
// after a first check that could not reach Redis.
func (w *Watch) Last() tierlimit.EvictionRisk {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// checked reports whether a check has reported a risk.
func (w *Watch) checked() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.have
}

// Due reports whether a check is due at now, and if so claims it: the
// caller must then call Check (once) and Done.
func (w *Watch) Due(now time.Time) bool {
	return now.UnixNano() >= w.next.Load() && w.polled.CompareAndSwap(false, true)
}

// Done ends a check claimed by Due.
func (w *Watch) Done() { w.polled.Store(false) }

// Check reads the settings now and reports them if they changed. It
// returns the reading, and the error that kept it from reaching a server,
// if one did: the caller says so in its own words (no line is logged for
// it here), and the last reading stands, or before any, the risk is
// unknown (a server slow or down at New is not reported safe).
func (w *Watch) Check(ctx context.Context) (tierlimit.EvictionRisk, error) {
	r, err := Read(ctx, w.rdb)
	if errors.Is(err, tierlimit.ErrMisconfigured) {
		// Not a reading: the caller refuses the client (see store.New).
		return tierlimit.EvictionRisk{Err: err}, err
	}
	if err != nil {
		w.next.Store(time.Now().Add(retry).UnixNano())
		if w.checked() {
			return w.Last(), err
		}
		r = tierlimit.EvictionRisk{Err: fmt.Errorf("redis did not answer INFO: %w", err)}
	} else {
		w.next.Store(time.Now().Add(Every).UnixNano())
	}
	w.mu.Lock()
	prev, had := w.last, w.have
	w.last, w.have = r, true
	w.mu.Unlock()
	changed := !had || prev.Risky() != r.Risky() || prev.Known() != r.Known() ||
		r.Risky() && r.EvictedKeys > prev.EvictedKeys
	if !changed {
		return r, err
	}
	if err == nil && ((r.Risky() && !prev.Risky()) || (!r.Known() && (!had || prev.Known()))) {
		logline.Or(w.logger).Warn("tierlimit: " + r.String())
	}
	if w.report != nil {
		w.report(r)
	}
	return r, err
}
