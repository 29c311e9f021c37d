package bench

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// unpack unmarshals a typed_config into m and validates it.
func unpack(t *testing.T, what string, a *anypb.Any, m proto.Message) {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := m.(validator).ValidateAll(); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// TestEnvoyConfig checks the Envoy config docs/serve.md gives: it parses
// as a bootstrap, with every typed_config of the types it names, passes
// the protos' validation rules, sends the ratelimit filter to a cluster
// that exists over HTTP/2, and routes to a cluster that exists.
func TestEnvoyConfig(t *testing.T) {
	doc, err := os.ReadFile("../../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Envoy\n")
	if !ok {
		t.Fatal("docs/serve.md has no Envoy section")
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("no yaml block in the Envoy section")
	}
	block, _, _ = strings.Cut(block, "```")
	var tree any
	if err := yaml.Unmarshal([]byte(block), &tree); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	js, err := json.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrap.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("not a bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Errorf("bootstrap: %v", err)
	}
	clusters := map[string]bool{}
	for _, c := range b.StaticResources.Clusters {
		clusters[c.Name] = true
		if opts, ok := c.TypedExtensionProtocolOptions["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; ok {
			var po upstreamhttp.HttpProtocolOptions
			unpack(t, c.Name+" protocol options", opts, &po)
			if c.Name == "ratelimit" && po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
				t.Error("the ratelimit cluster does not speak HTTP/2 (gRPC needs it)")
			}
		} else if c.Name == "ratelimit" {
			t.Error("the ratelimit cluster has no HTTP/2 protocol options")
		}
	}
	var sawFilter bool
	for _, l := range b.StaticResources.Listeners {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				var m hcm.HttpConnectionManager
				unpack(t, f.Name, f.GetTypedConfig(), &m)
				for _, vh := range m.GetRouteConfig().GetVirtualHosts() {
					if len(vh.RateLimits) == 0 {
						t.Errorf("virtual host %s sends no descriptors", vh.Name)
					}
					for _, r := range vh.Routes {
						if c := r.GetRoute().GetCluster(); !clusters[c] {
							t.Errorf("route to cluster %q, which is not defined", c)
						}
					}
				}
				for _, hf := range m.HttpFilters {
					switch hf.Name {
					case "envoy.filters.http.ratelimit":
						var rl ratelimitfilter.RateLimit
						unpack(t, hf.Name, hf.GetTypedConfig(), &rl)
						sawFilter = true
						if c := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); !clusters[c] {
							t.Errorf("the ratelimit filter calls cluster %q, which is not defined", c)
						}
						if rl.Domain != "edge" {
							t.Errorf("domain %q, want the example config's edge", rl.Domain)
						}
					case "envoy.filters.http.router":
						var r router.Router
						unpack(t, hf.Name, hf.GetTypedConfig(), &r)
					default:
						t.Errorf("unexpected http filter %s", hf.Name)
					}
				}
			}
		}
	}
	if !sawFilter {
		t.Error("no envoy.filters.http.ratelimit filter")
	}
}
