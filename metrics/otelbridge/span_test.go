package otelbridge

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/internal/logtest"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestSpanDecision checks the attributes a decision sets on a recording
// span, the last decision told winning, and that a span that does not
// record is left alone.
func TestSpanDecision(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, span := tp.Tracer("test").Start(context.Background(), "call")
	SpanDecision(ctx, "per-ip", tierlimit.Result{Allowed: true, Remaining: 9, Source: tierlimit.SourceLocal})
	SpanDecision(ctx, "per-user", tierlimit.Result{Allowed: false, RetryAfter: 1500 * time.Millisecond, Source: tierlimit.SourceRemote})
	span.End()
	SpanDecision(trace.ContextWithSpan(context.Background(), trace.SpanFromContext(context.Background())), "none", tierlimit.Result{})
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range ended[0].Attributes() {
		got[kv.Key] = kv.Value
	}
	for _, want := range []attribute.KeyValue{
		AttrPolicy.String("per-user"),
		AttrResult.String(ResultRejected),
		AttrSource.String("remote"),
		AttrRemaining.Int64(0),
		AttrRetryAfter.Float64(1.5),
	} {
		if got[want.Key] != want.Value {
			t.Errorf("span attribute %s = %v, want %v", want.Key, got[want.Key].String(), want.Value.String())
		}
	}
}

// TestLogger checks that the bound of WithMaxLimits, once reached, is
// logged once per limiter to WithLogger's logger and nothing reaches the
// default logger; without WithLogger, the default logger has it.
func TestLogger(t *testing.T) {
	logtest.Check(t, 1, []string{"level=WARN", "limiter=api", "max_limits=1"}, func(logger *slog.Logger) {
		opts := []Option{WithMaxLimits(1)}
		if logger != nil {
			opts = append(opts, WithLogger(logger))
		}
		b, _ := newBridge(t, opts...)
		o := b.Observer("api")
		for r := int64(1); r <= 5; r++ {
			o.Decision(tierlimit.Decision{Allowed: true, Limit: tierlimit.PerSecond(r)})
		}
	})
}
