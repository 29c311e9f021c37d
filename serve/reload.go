package serve

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// LoadConfig reads the config at path: a YAML file, or a directory whose
// *.yaml and *.yml files (not those whose name starts with a dot) each hold
// domains, as envoyproxy/ratelimit reads its runtime directory. Errors wrap
// ErrConfig for a config ParseConfig refuses, or are the file system's.
func LoadConfig(path string) (*Config, error) {
	files, err := readFiles(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(files...)
}

func readFiles(path string) ([]File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	names := []string{path}
	if fi.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		names = names[:0]
		for _, e := range ents {
			n := e.Name()
			if e.IsDir() || strings.HasPrefix(n, ".") || (!strings.HasSuffix(n, ".yaml") && !strings.HasSuffix(n, ".yml")) {
				continue
			}
			names = append(names, filepath.Join(path, n))
		}
		slices.Sort(names)
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: %s: no .yaml or .yml file", ErrConfig, path)
		}
	}
	files := make([]File, 0, len(names))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: n, Data: data})
	}
	return files, nil
}

// Reloader keeps a Server's config in step with the files at a path: Reload
// reads them and, when they changed, parses them and applies the result;
// a config it cannot read, parse or apply leaves the server's config as it
// was and is logged with the reason. A Reloader is safe for concurrent use.
type Reloader struct {
	s    *Server
	path string

	mu      sync.Mutex
	last    []File // the files of the config in effect, or of the last one refused
	lastErr string // why the last reload failed, "" after a success
}

// NewReloader returns a Reloader of s's config from path. It assumes s
// runs the config at path as it is now.
func NewReloader(s *Server, path string) *Reloader {
	r := &Reloader{s: s, path: path}
	r.last, _ = readFiles(path)
	return r
}

// ErrUnchanged is returned by Reload when the files are those of the config
// in effect (or of the last one refused).
var ErrUnchanged = errors.New("serve: config files unchanged")

// Reload applies the config at the Reloader's path if its files changed
// since the last call. It returns ErrUnchanged, nil when the new config is
// in effect, or the reason it was refused (also logged and counted once,
// until the reason changes).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	files, err := readFiles(r.path)
	if err == nil && sameFiles(files, r.last) {
		return ErrUnchanged
	}
	if err == nil {
		r.last = files
		var c *Config
		if c, err = ParseConfig(files...); err == nil {
			err = r.s.SetConfig(c)
		}
	}
	if err != nil {
		if msg := err.Error(); msg != r.lastErr {
			r.lastErr = msg
			r.s.metrics.configLoaded(false)
			r.s.log.Error("serve: config reload failed; the previous config stays in effect", "path", r.path, "err", err)
		}
		return err
	}
	r.lastErr = ""
	r.s.log.Info("serve: config reloaded", "path", r.path, "domains", r.s.Config().Domains())
	return nil
}

func sameFiles(a, b []File) bool {
	return slices.EqualFunc(a, b, func(x, y File) bool { return x.Name == y.Name && bytes.Equal(x.Data, y.Data) })
}
