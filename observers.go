package tierlimit

// Observers returns an Observer that passes what a limiter does to each
// of obs, in order: one limiter observed by several sinks (a Prometheus
// Collector's Observer and an OpenTelemetry Bridge's, say), through the
// one Observer its WithObserver option takes. Nil entries are skipped. A
// field of the result is nil when no Observer sets it, and is the one
// func itself when only one does, so that fanning out costs nothing where
// there is nothing to fan out.
//
// The funcs are read when Observers is called: like a limiter, it must
// be given Observers that are not changed afterwards. Every field of
// Observer is fanned out, those added later too (a test of this package
// fails for a field that is not).
func Observers(obs ...*Observer) *Observer {
	var set []*Observer
	for _, o := range obs {
		if o != nil {
			set = append(set, o)
		}
	}
	return &Observer{
		Decision:  fan(set, func(o *Observer) func(Decision) { return o.Decision }),
		RedisCall: fan(set, func(o *Observer) func(RedisCall) { return o.RedisCall }),
		Breaker:   fan(set, func(o *Observer) func(BreakerChange) { return o.Breaker }),
		Eviction:  fan(set, func(o *Observer) func(EvictionRisk) { return o.Eviction }),
		GiveBack:  fan(set, func(o *Observer) func(GiveBack) { return o.GiveBack }),
		Permit:    fan(set, func(o *Observer) func(PermitDecision) { return o.Permit }),
	}
}

// fan returns a func that calls the field field picks of each of obs that
// sets it; nil if none does.
func fan[E any](obs []*Observer, field func(*Observer) func(E)) func(E) {
	var fs []func(E)
	for _, o := range obs {
		if f := field(o); f != nil {
			fs = append(fs, f)
		}
	}
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(e E) {
		for _, f := range fs {
			f(e)
		}
	}
}
