package otelbridge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/httplimit"
	"github.com/tierlimit/tierlimit/local"
)

// TestSpanDecisionHTTP checks SpanDecision behind httplimit: the span of
// an admitted request says so, the span of a refused one names the
// limiter that refused it, though the limiter after it peeked.
func TestSpanDecisionHTTP(t *testing.T) {
	tight, err := local.New(tierlimit.PerMinute(1))
	if err != nil {
		t.Fatal(err)
	}
	defer tight.Close()
	roomy, err := local.New(tierlimit.PerMinute(100))
	if err != nil {
		t.Fatal(err)
	}
	defer roomy.Close()
	mw, err := httplimit.New(tight, httplimit.WithName("tight"), httplimit.WithLimiter("roomy", roomy, nil),
		httplimit.WithDecisionFunc(SpanDecision))
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	for _, want := range []struct {
		code           int
		policy, result string
	}{
		{http.StatusOK, "roomy", ResultAcquired},
		{http.StatusTooManyRequests, "tight", ResultRejected},
	} {
		ctx, span := tracer.Start(context.Background(), "request")
		r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		span.End()
		ended := rec.Ended()
		got := map[attribute.Key]string{}
		for _, kv := range ended[len(ended)-1].Attributes() {
			got[kv.Key] = kv.Value.String()
		}
		if w.Code != want.code || got[AttrPolicy] != want.policy || got[AttrResult] != want.result {
			t.Errorf("status %d, span policy %q result %q; want %d, %q, %q", w.Code, got[AttrPolicy], got[AttrResult], want.code, want.policy, want.result)
		}
	}
}
