package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/hybrid"
)

// flags are the command's settings.
type flags struct {
	config         string
	grpcAddr       string
	httpAddr       string
	reloadInterval time.Duration
	shutdown       time.Duration
	shadow         bool
	headers        bool
	limitHeader    string
	remainHeader   string
	resetHeader    string
	logFormat      string
	callBudget     time.Duration

	redisURL      string
	redisAddrs    string
	redisMode     string
	redisMaster   string
	redisUser     string
	redisPassword string
	redisDB       int
	redisTLS      bool
}

// envPrefix is the prefix of the environment variables that set flags.
const envPrefix = "TIERLIMIT_SERVE_"

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	var f flags
	fs := flag.NewFlagSet("tierlimit-serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "the config: a YAML file, or a directory of them (default: an example config)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "where the RLS v3 and health gRPC services listen")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "where /metrics and /healthcheck listen (empty: nowhere)")
	fs.DurationVar(&f.reloadInterval, "reload-interval", 5*time.Second, "how often the config files are checked for changes (0: only on SIGHUP)")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", 10*time.Second, "how long requests in flight may take to finish at shutdown")
	fs.BoolVar(&f.shadow, "shadow", false, "global shadow mode: decide and count, but answer OK to every request")
	fs.BoolVar(&f.headers, "response-headers", false, "add the limit, remaining and reset headers of the most restrictive descriptor to responses")
	fs.StringVar(&f.limitHeader, "limit-header", "RateLimit-Limit", "the name of the limit header")
	fs.StringVar(&f.remainHeader, "remaining-header", "RateLimit-Remaining", "the name of the remaining header")
	fs.StringVar(&f.resetHeader, "reset-header", "RateLimit-Reset", "the name of the reset header (seconds)")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fs.DurationVar(&f.callBudget, "call-budget", hybrid.DefaultCallBudget, "the longest a decision waits on Redis before the hybrid tier decides without it (hybrid.WithCallBudget, 1ms to 10s)")
	fs.StringVar(&f.redisURL, "redis-url", "", "a standalone Redis: redis://[user:password@]host:port/db (rediss:// for TLS)")
	fs.StringVar(&f.redisAddrs, "redis-addrs", "", "comma-separated host:port of Redis: one server, the Sentinels (with -redis-master), or Cluster nodes (with -redis-mode cluster)")
	fs.StringVar(&f.redisMode, "redis-mode", "", "single, sentinel or cluster (default: sentinel with -redis-master, else single)")
	fs.StringVar(&f.redisMaster, "redis-master", "", "the Sentinel master name")
	fs.StringVar(&f.redisUser, "redis-username", "", "the Redis ACL user (with -redis-addrs)")
	fs.StringVar(&f.redisPassword, "redis-password", "", "the Redis password (with -redis-addrs; prefer the environment variable)")
	fs.IntVar(&f.redisDB, "redis-db", 0, "the database (with -redis-addrs, single or sentinel)")
	fs.BoolVar(&f.redisTLS, "redis-tls", false, "connect to Redis with TLS (with -redis-addrs)")
	if err := fromEnv(fs); err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected arguments %q", fs.Args())
	}
	return &f, nil
}

// fromEnv sets each flag that has an environment variable; the command line
// parsed afterwards wins.
func fromEnv(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(fl *flag.Flag) {
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && err == nil {
			if e := fl.Value.Set(v); e != nil {
				err = usagef("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}
