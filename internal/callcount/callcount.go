// Package callcount counts the Lua script calls a go-redis client sends.
package callcount

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Hook is a go-redis hook counting EVALSHA and EVAL commands, pipelined or
// not. Add it with client.AddHook. It is safe for concurrent use.
type Hook struct{ n atomic.Int64 }

// Calls returns the script calls counted so far.
func (h *Hook) Calls() int64 { return h.n.Load() }

// DialHook passes dials through.
func (h *Hook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a command.
func (h *Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (h *Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *Hook) count(cmd redis.Cmder) {
	if name := cmd.Name(); name == "evalsha" || name == "eval" {
		h.n.Add(1)
	}
}

// Trips is a go-redis hook counting round trips: every command, and a
// pipeline once. Add it with client.AddHook. It is safe for concurrent
// use.
type Trips struct{ n atomic.Int64 }

// Load returns the round trips counted so far.
func (h *Trips) Load() int64 { return h.n.Load() }

// DialHook passes dials through.
func (h *Trips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a command.
func (h *Trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}

// ProcessPipelineHook counts a pipeline once.
func (h *Trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}
