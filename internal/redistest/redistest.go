// Package redistest starts real redis-server processes for tests.
//
// Every server listens on a free loopback port, keeps no persistence
// (--save "" --appendonly no), lives in its own temporary directory with its
// output in a log file there, and is killed by t.Cleanup even when the test
// fails. When no redis-server binary is found the test is skipped, unless
// TIERLIMIT_REQUIRE_REDIS=1 is set (as in CI), in which case it fails.
//
// The binary is taken from the REDIS_SERVER environment variable when set,
// else looked up as redis-server on PATH.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that, set to "1", turns a missing
// redis-server into a test failure instead of a skip.
const RequireEnv = "TIERLIMIT_REQUIRE_REDIS"

// ServerEnv is the environment variable naming the redis-server binary to use
// instead of the one found on PATH.
const ServerEnv = "REDIS_SERVER"

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// startAttempts is how many ports Start tries when the one it picked turns
// out to be taken by the time redis-server binds it.
const startAttempts = 4

// Required reports whether TIERLIMIT_REQUIRE_REDIS=1 is set.
func Required() bool {
	return os.Getenv(RequireEnv) == "1"
}

// Available reports whether a redis-server binary is on PATH (or at the path
// named by the REDIS_SERVER environment variable).
func Available() bool {
	_, err := serverBinary()
	return err == nil
}

// serverBinary returns the path of the redis-server binary to run.
func serverBinary() (string, error) {
	if p := os.Getenv(ServerEnv); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("%s=%q is not an executable: %w", ServerEnv, p, err)
		}
		return path, nil
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH (install it or set %s): %w", ServerEnv, err)
	}
	return path, nil
}

// requireBinary returns the redis-server binary, or skips t (fails it when
// Required) if there is none.
func requireBinary(t testing.TB) string {
	t.Helper()
	bin, err := serverBinary()
	if err == nil {
		return bin
	}
	if Required() {
		t.Fatalf("redistest: %v; %s=1 requires a real Redis", err, RequireEnv)
	}
	t.Skipf("redistest: skipping, %v", err)
	return ""
}

var versions sync.Map // binary path -> version string

// serverVersion returns the version reported by bin --version, or "unknown".
func serverVersion(bin string) string {
	if v, ok := versions.Load(bin); ok {
		return v.(string)
	}
	v := "unknown"
	out, err := exec.Command(bin, "--version").Output()
	if err == nil {
		for _, f := range strings.Fields(string(out)) {
			if s, ok := strings.CutPrefix(f, "v="); ok {
				v = s
				break
			}
		}
	}
	versions.Store(bin, v)
	return v
}

// FreePort returns a TCP port on 127.0.0.1 that was free when it was asked
// for. Another process may take it before the caller binds it.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// freeClusterPort returns a free port p whose cluster bus port p+10000 is
// free as well.
func freeClusterPort() (int, error) {
	for range 200 {
		p, err := FreePort()
		if err != nil {
			return 0, err
		}
		if p+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		if err != nil {
			continue
		}
		if err := l.Close(); err != nil {
			return 0, err
		}
		return p, nil
	}
	return 0, errors.New("no free port with a free cluster bus port (port+10000)")
}

// Server is one redis-server process owned by a test.
//
// Its methods are safe for concurrent use.
type Server struct {
	// Addr is the server's address, "127.0.0.1:port".
	Addr string
	// Port is the server's TCP port.
	Port int
	// Dir is the server's working directory, removed at cleanup.
	Dir string
	// LogPath is the file receiving the server's stdout and stderr; every
	// (re)start appends to it.
	LogPath string

	bin      string
	args     []string // full redis-server arguments
	password string   // from --requirepass, used by Client and readiness checks

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has exited
	killed bool          // Kill was called for cmd
}

// Start starts a fresh redis-server bound to 127.0.0.1 on a free port, with
// no persistence and its own temporary directory, waits until it answers
// PING (at most 10 s) and registers t.Cleanup to kill it and remove its
// directory. Extra args are appended to the redis-server command line, so
// they override the defaults (for example "--requirepass", "secret"); they
// must not change the port or bind address.
//
// When no redis-server is found, Start skips t, or fails it if Required.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, false, args)
}

// start starts a server; cluster adds the cluster-mode options.
func start(t testing.TB, cluster bool, extra []string) *Server {
	t.Helper()
	bin := requireBinary(t)
	dir := t.TempDir()
	s := &Server{
		Dir:      dir,
		LogPath:  filepath.Join(dir, "redis.log"),
		bin:      bin,
		password: passwordFrom(extra),
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		if unexpected := s.kill(); unexpected != "" && t.Failed() {
			t.Logf("redistest: redis-server on %s had exited on its own (%s); log tail:\n%s", s.Addr, unexpected, s.logTail())
		}
	})

	var lastErr error
	for range startAttempts {
		var port int
		var err error
		if cluster {
			port, err = freeClusterPort()
		} else {
			port, err = FreePort()
		}
		if err != nil {
			t.Fatalf("redistest: picking a port: %v", err)
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.args = []string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--dir", dir,
			"--save", "",
			"--appendonly", "no",
			"--daemonize", "no",
			"--logfile", "",
		}
		if cluster {
			s.args = append(s.args,
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-node-timeout", "2000",
				"--cluster-announce-ip", "127.0.0.1",
			)
		}
		s.args = append(s.args, extra...)

		lastErr = s.launchAndWait()
		if lastErr == nil {
			t.Logf("redistest: redis-server %s on %s", serverVersion(bin), s.Addr)
			return s
		}
		s.kill()
		if !s.addrInUse() {
			break
		}
	}
	t.Fatalf("redistest: starting redis-server on %s: %v; log tail:\n%s", s.Addr, lastErr, s.logTail())
	return nil
}

// passwordFrom returns the value following --requirepass in args, if any.
func passwordFrom(args []string) string {
	pw := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--requirepass" {
			pw = args[i+1]
		}
	}
	return pw
}

// launchAndWait starts the process and waits until it answers PING.
func (s *Server) launchAndWait() error {
	done, err := s.launch()
	if err != nil {
		return err
	}
	return s.waitReady(done, time.Now().Add(startTimeout))
}

// launch starts redis-server with s.args, its output appended to s.LogPath.
func (s *Server) launch() (<-chan struct{}, error) {
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "=== redistest: %s starting %s on %s\n", time.Now().Format(time.RFC3339Nano), s.bin, s.Addr)

	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.Dir
	cmd.Stdin = nil
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()

	s.mu.Lock()
	s.cmd, s.done, s.killed = cmd, done, false
	s.mu.Unlock()
	return done, nil
}

// waitReady polls the server until it answers PING, the process exits or the
// deadline passes.
func (s *Server) waitReady(done <-chan struct{}, deadline time.Time) error {
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited during startup (%s)", s.exitState())
		default:
		}
		err := s.ping()
		if err == nil {
			// A taken port can make PING reach another process's server;
			// make sure ours is still alive.
			select {
			case <-done:
				return fmt.Errorf("redis-server exited during startup (%s)", s.exitState())
			case <-time.After(20 * time.Millisecond):
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PING answer within %v: %w", startTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping sends AUTH (when a password is set) and PING over a raw connection.
func (s *Server) ping() error {
	conn, err := net.DialTimeout("tcp", s.Addr, 250*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	if s.password != "" {
		if err := writeCommand(conn, "AUTH", s.password); err != nil {
			return err
		}
		if _, err := readLine(r); err != nil {
			return err
		}
	}
	if err := writeCommand(conn, "PING"); err != nil {
		return err
	}
	line, err := readLine(r)
	if err != nil {
		return err
	}
	switch {
	case line == "+PONG", strings.HasPrefix(line, "-NOAUTH"):
		return nil
	default:
		return fmt.Errorf("PING answered %q", line)
	}
}

// writeCommand writes args as a RESP array of bulk strings.
func writeCommand(w io.Writer, args ...string) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// readLine reads one CRLF-terminated line.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// Client returns a *redis.Client for s (authenticated when s was started
// with --requirepass), closed at t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr,
		Password:              s.password,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true, // as tierlimit's docs recommend
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill sends SIGKILL to the server and waits for the process to exit. It does
// nothing if the server is not running.
func (s *Server) Kill() {
	s.kill()
}

// kill is Kill, also returning a description of the exit status when the
// process had already exited without being killed.
func (s *Server) kill() (unexpected string) {
	s.mu.Lock()
	cmd, done, killed := s.cmd, s.done, s.killed
	if cmd != nil {
		s.killed = true
	}
	s.mu.Unlock()
	if cmd == nil {
		return ""
	}
	select {
	case <-done:
		if !killed {
			return s.exitState()
		}
		return ""
	default:
	}
	killProcess(cmd.Process)
	<-done
	return ""
}

// exitState describes how the current process exited.
func (s *Server) exitState() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.ProcessState == nil {
		return "still running"
	}
	return s.cmd.ProcessState.String()
}

// Restart kills the server if it is still running and starts a new empty
// redis-server with the same arguments on the same port, then waits until it
// answers PING. For a cluster node the node keeps its cluster configuration
// (identity and slots) but no data, as after a crash without persistence.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	for _, name := range []string{"dump.rdb", "appendonly.aof", "appendonlydir"} {
		if err := os.RemoveAll(filepath.Join(s.Dir, name)); err != nil {
			t.Fatalf("redistest: clearing data of %s: %v", s.Addr, err)
		}
	}
	s.relaunch(t)
}

// RestartKeeping kills the server if it is still running and starts it
// again on the same port with the data it persisted (start it with
// "--appendonly", "yes" for the data to outlive a kill), then waits until
// it answers PING.
func (s *Server) RestartKeeping(t testing.TB) {
	t.Helper()
	s.Kill()
	s.relaunch(t)
}

// relaunch starts the killed server again with its arguments.
func (s *Server) relaunch(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		done, err := s.launch()
		if err == nil {
			err = s.waitReady(done, deadline)
		}
		if err == nil {
			t.Logf("redistest: redis-server %s on %s (restarted)", serverVersion(s.bin), s.Addr)
			return
		}
		s.Kill()
		// The old port may briefly be held by another socket; retry.
		if !s.addrInUse() || time.Now().After(deadline) {
			t.Fatalf("redistest: restarting redis-server on %s: %v; log tail:\n%s", s.Addr, err, s.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause sends SIGSTOP to the server, so it accepts connections but answers
// nothing until Resume. It does nothing on platforms without SIGSTOP.
func (s *Server) Pause() {
	s.signal(sigStop)
}

// Resume sends SIGCONT to a server stopped by Pause.
func (s *Server) Resume() {
	s.signal(sigCont)
}

// signal sends sig to the running process, if any.
func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || sig == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
}

// addrInUse reports whether the latest start failed because the port was
// taken.
func (s *Server) addrInUse() bool {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return false
	}
	if i := bytes.LastIndex(b, []byte("=== redistest:")); i >= 0 {
		b = b[i:]
	}
	return bytes.Contains(b, []byte("Address already in use"))
}

// logTail returns the last lines of the server's log.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// QuietClientLogs drops go-redis's own log lines (it logs every dial that
// fails, which a test that stops Redis makes by the dozen), unless
// TIERLIMIT_REDIS_LOG is set. A TestMain calls it before the tests run:
// go-redis's logger is global.
func QuietClientLogs() {
	if os.Getenv("TIERLIMIT_REDIS_LOG") == "" {
		redis.SetLogger(quiet{})
	}
}

// quiet is a go-redis logger that drops every line.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
