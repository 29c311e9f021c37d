package serve

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tierlimit/tierlimit"
)

// ErrConfig is wrapped by every error of ParseConfig and LoadConfig: a
// configuration the server refuses.
var ErrConfig = errors.New("serve: invalid config")

// Unit is the period of a rate_limit, as envoyproxy/ratelimit names it.
type Unit string

// The units of rate_limit.unit (case-insensitive in YAML). Week, month (30
// days) and year (365 days) are envoyproxy/ratelimit's too.
const (
	UnitSecond Unit = "second"
	UnitMinute Unit = "minute"
	UnitHour   Unit = "hour"
	UnitDay    Unit = "day"
	UnitWeek   Unit = "week"
	UnitMonth  Unit = "month"
	UnitYear   Unit = "year"
)

var unitPeriods = map[Unit]time.Duration{
	UnitSecond: time.Second,
	UnitMinute: time.Minute,
	UnitHour:   time.Hour,
	UnitDay:    24 * time.Hour,
	UnitWeek:   7 * 24 * time.Hour,
	UnitMonth:  30 * 24 * time.Hour,
	UnitYear:   365 * 24 * time.Hour,
}

// Algorithm names how a rule counts. The windows, GCRA and the sliding log
// run on the remote tier (one Redis call per decision); the token bucket
// runs on any tier.
type Algorithm string

// The algorithms of rate_limit.algorithm (default AlgoTokenBucket).
const (
	AlgoTokenBucket    Algorithm = "token_bucket"
	AlgoGCRA           Algorithm = "gcra"
	AlgoFixedWindow    Algorithm = "fixed_window"
	AlgoAnchoredWindow Algorithm = "anchored_window"
	AlgoSlidingWindow  Algorithm = "sliding_window"
	AlgoSlidingLog     Algorithm = "sliding_log"
)

// Tier names where a rule decides.
type Tier string

// The tiers of rate_limit.tier. The default is TierHybrid for the token
// bucket and TierRemote for every other algorithm.
const (
	// TierHybrid leases tokens from Redis and decides in process; it keeps
	// deciding, at this replica's share, while Redis is down.
	TierHybrid Tier = "hybrid"
	// TierRemote decides in Redis, exactly, one call per decision.
	TierRemote Tier = "remote"
	// TierLocal decides in this process only: each replica has its own
	// bucket.
	TierLocal Tier = "local"
)

// Rule is the rate_limit of one descriptor node of a Config, resolved.
// A Rule is immutable once its Config is built.
type Rule struct {
	// FullKey names the node: the domain and the configured key_value path,
	// dot-separated, as envoyproxy/ratelimit names its stats.
	FullKey string
	// Name is rate_limit.name, the name replaces refer to.
	Name     string
	Replaces []string
	// Unit and RequestsPerUnit are the rule as written, reported back in
	// DescriptorStatus.current_limit.
	Unit            Unit
	RequestsPerUnit uint32
	// Limit is what the limiter enforces: tierlimit.Blocked when
	// RequestsPerUnit is 0 (every request over the limit).
	Limit          tierlimit.Limit
	Algorithm      Algorithm
	Tier           Tier
	Unlimited      bool
	Shadow         bool
	DetailedMetric bool

	// id names the rule's node unambiguously: the limiter key of its
	// configured domain, keys and values (see appendKey).
	id string
}

// Config is a set of domains, each a tree of descriptors with their rules.
// It is immutable once built and safe for concurrent use.
type Config struct {
	domains map[string]*node
	byID    map[string]*Rule // every rule, by id
}

// node is one level of a domain's descriptor tree.
type node struct {
	rule *Rule
	// exact holds the children configured with a value, by key then value;
	// any holds those configured with a key only (any value).
	exact map[string]map[string]*node
	any   map[string]*node
	// globs are the children whose value holds a '*', in file order.
	globs []glob
}

type glob struct {
	key   string
	parts []string // the value split on '*'
	node  *node
}

// yamlFile is one file of envoyproxy/ratelimit's format, with this
// server's additions in rate_limit (algorithm, burst, tier).
type yamlFile struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
}

type yamlRateLimit struct {
	RequestsPerUnit *uint32       `yaml:"requests_per_unit"`
	Unit            string        `yaml:"unit"`
	Unlimited       bool          `yaml:"unlimited"`
	Name            string        `yaml:"name"`
	Replaces        []yamlReplace `yaml:"replaces"`
	Algorithm       string        `yaml:"algorithm"`
	Burst           int64         `yaml:"burst"`
	Tier            string        `yaml:"tier"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

// File is one configuration file's name and contents.
type File struct {
	Name string
	Data []byte
}

// ParseConfig builds a Config from files in envoyproxy/ratelimit's format,
// one domain per file (a file may hold several YAML documents, each a
// domain). A key the format does not know, a domain given twice, a bad unit
// or limit, or two nodes with one key and value at the same level are
// errors wrapping ErrConfig, naming the file.
func ParseConfig(files ...File) (*Config, error) {
	c := &Config{domains: make(map[string]*node), byID: make(map[string]*Rule)}
	for _, f := range files {
		dec := yaml.NewDecoder(bytes.NewReader(f.Data))
		dec.KnownFields(true)
		for {
			var y yamlFile
			err := dec.Decode(&y)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrConfig, f.Name, err)
			}
			if err := c.addDomain(y); err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrConfig, f.Name, err)
			}
		}
	}
	return c, nil
}

// Domains returns the number of domains c holds.
func (c *Config) Domains() int { return len(c.domains) }

func (c *Config) addDomain(y yamlFile) error {
	if y.Domain == "" {
		return errors.New("empty domain")
	}
	if _, dup := c.domains[y.Domain]; dup {
		return fmt.Errorf("duplicate domain %q", y.Domain)
	}
	root := new(node)
	if err := root.load(c, y.Domain, y.Domain, nil, y.Descriptors); err != nil {
		return err
	}
	c.domains[y.Domain] = root
	return nil
}

// load adds descs below n: parent is n's FullKey, at its configured
// entries below domain.
func (n *node) load(c *Config, domain, parent string, at []Entry, descs []yamlDescriptor) error {
	for _, d := range descs {
		if d.Key == "" {
			return fmt.Errorf("%s: descriptor with an empty key", parent)
		}
		path := parent + "." + d.Key
		if d.Value != "" {
			path += "_" + d.Value
		}
		child := new(node)
		if d.RateLimit != nil {
			r, err := newRule(path, d)
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			r.id = string(appendKey(nil, domain, append(at[:len(at):len(at)], Entry{d.Key, d.Value}), nil))
			c.byID[r.id] = r
			child.rule = r
		}
		if err := child.load(c, domain, path, append(at[:len(at):len(at)], Entry{d.Key, d.Value}), d.Descriptors); err != nil {
			return err
		}
		if err := n.add(d.Key, d.Value, child); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	}
	return nil
}

func (n *node) add(key, value string, child *node) error {
	switch {
	case value == "":
		if n.any[key] != nil {
			return errors.New("duplicate descriptor")
		}
		if n.any == nil {
			n.any = make(map[string]*node)
		}
		n.any[key] = child
	case strings.Contains(value, "*"):
		for _, g := range n.globs {
			if g.key == key && strings.Join(g.parts, "*") == value {
				return errors.New("duplicate descriptor")
			}
		}
		n.globs = append(n.globs, glob{key: key, parts: strings.Split(value, "*"), node: child})
	default:
		if n.exact[key][value] != nil {
			return errors.New("duplicate descriptor")
		}
		if n.exact == nil {
			n.exact = make(map[string]map[string]*node)
		}
		if n.exact[key] == nil {
			n.exact[key] = make(map[string]*node)
		}
		n.exact[key][value] = child
	}
	return nil
}

func newRule(path string, d yamlDescriptor) (*Rule, error) {
	y := d.RateLimit
	r := &Rule{
		FullKey:        path,
		Name:           y.Name,
		Unlimited:      y.Unlimited,
		Shadow:         d.ShadowMode,
		DetailedMetric: d.DetailedMetric,
	}
	for _, rep := range y.Replaces {
		if rep.Name == "" {
			return nil, errors.New("an empty replaces entry")
		}
		if rep.Name == y.Name {
			return nil, errors.New("replaces names its own rate_limit")
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	unit := Unit(strings.ToLower(y.Unit))
	period, validUnit := unitPeriods[unit]
	if y.Unlimited {
		if y.Unit != "" || y.RequestsPerUnit != nil {
			return nil, errors.New("unlimited with a unit or requests_per_unit")
		}
		return r, nil
	}
	if !validUnit {
		return nil, fmt.Errorf("invalid unit %q (want second, minute, hour, day, week, month or year)", y.Unit)
	}
	if y.RequestsPerUnit == nil {
		return nil, errors.New("rate_limit without requests_per_unit")
	}
	r.Unit, r.RequestsPerUnit = unit, *y.RequestsPerUnit
	r.Algorithm = Algorithm(y.Algorithm)
	if r.Algorithm == "" {
		r.Algorithm = AlgoTokenBucket
	}
	if !validAlgorithm(r.Algorithm) {
		return nil, fmt.Errorf("unknown algorithm %q", y.Algorithm)
	}
	r.Tier = Tier(y.Tier)
	switch {
	case r.Tier == "" && r.Algorithm == AlgoTokenBucket:
		r.Tier = TierHybrid
	case r.Tier == "":
		r.Tier = TierRemote
	case r.Tier != TierHybrid && r.Tier != TierRemote && r.Tier != TierLocal:
		return nil, fmt.Errorf("unknown tier %q (want hybrid, remote or local)", y.Tier)
	case r.Tier != TierRemote && r.Algorithm != AlgoTokenBucket:
		return nil, fmt.Errorf("algorithm %s runs on the remote tier only, not %s", r.Algorithm, r.Tier)
	}
	if y.Burst < 0 {
		return nil, fmt.Errorf("negative burst %d", y.Burst)
	}
	if y.Burst != 0 && r.Algorithm != AlgoTokenBucket && r.Algorithm != AlgoGCRA {
		return nil, fmt.Errorf("burst on %s (only token_bucket and gcra have one)", r.Algorithm)
	}
	if r.RequestsPerUnit == 0 {
		if y.Burst != 0 {
			return nil, errors.New("burst with requests_per_unit 0")
		}
		r.Limit = tierlimit.Blocked
		return r, nil
	}
	r.Limit = tierlimit.Limit{Rate: int64(r.RequestsPerUnit), Period: period, Burst: y.Burst}
	if err := r.Limit.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

func validAlgorithm(a Algorithm) bool {
	switch a {
	case AlgoTokenBucket, AlgoGCRA, AlgoFixedWindow, AlgoAnchoredWindow, AlgoSlidingWindow, AlgoSlidingLog:
		return true
	}
	return false
}

// algorithms returns the remote algorithms c's rules use.
func (c *Config) algorithms() map[Algorithm]bool {
	used := make(map[Algorithm]bool)
	var walk func(*node)
	walk = func(n *node) {
		if n.rule != nil && n.rule.Tier == TierRemote {
			used[n.rule.Algorithm] = true
		}
		for _, m := range n.exact {
			for _, c := range m {
				walk(c)
			}
		}
		for _, c := range n.any {
			walk(c)
		}
		for _, g := range n.globs {
			walk(g.node)
		}
	}
	for _, root := range c.domains {
		walk(root)
	}
	return used
}
