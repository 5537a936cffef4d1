package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/internal/leaks"
	"github.com/kvradix/kvradix/internal/testwait"
	"github.com/kvradix/kvradix/serve"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaks.Ignore()...)
}

// `kvradix serve` starts with an engine from -workers, answers over HTTP,
// guards registration with -token, and on SIGTERM stops gracefully.
func TestServeCommand(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	base, stop := startServe(t, "-workers", "3="+pub.Addr(), "-model-name", "m", "-token", "s3cret")
	resp, err := http.Get(base + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	var workers []map[string]any
	json.NewDecoder(resp.Body).Decode(&workers)
	resp.Body.Close()
	if len(workers) != 1 || workers[0]["instance_id"] != float64(3) {
		t.Fatalf("workers %v", workers)
	}
	for _, auth := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequest("POST", base+"/unregister", strings.NewReader(`{"instance_id": 3, "model_name": "m"}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("unregister with %q: %d, want 401", auth, resp.StatusCode)
		}
	}
	stop()
}

// startServe runs `kvradix serve -listen 127.0.0.1:0 args...` until the
// returned func sends it SIGTERM and checks it stops cleanly; it returns
// the service's base URL.
func startServe(t *testing.T, args ...string) (string, func()) {
	t.Helper()
	base, stop := startServeErr(t, args...)
	return base, func() {
		t.Helper()
		if err := stop(); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	}
}

// startServeErr is startServe whose stop returns run's error.
func startServeErr(t *testing.T, args ...string) (string, func() error) {
	t.Helper()
	out, w := io.Pipe()
	stop := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(append([]string{"serve", "-listen", "127.0.0.1:0"}, args...), w, io.Discard, stop)
		w.Close()
	}()
	lines := bufio.NewScanner(out)
	base := ""
	for lines.Scan() && lines.Text() != "kvradix: ready" {
		if _, addr, ok := strings.Cut(lines.Text(), "serving on "); ok {
			base = strings.TrimSpace(addr)
		}
	}
	if base == "" || lines.Text() != "kvradix: ready" {
		t.Fatalf("no line says where it serves, then that it is ready (%v)", <-done)
	}
	go io.Copy(io.Discard, out)
	return base, func() error {
		t.Helper()
		http.DefaultClient.CloseIdleConnections()
		stop <- syscall.SIGTERM
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("no shutdown within 20 s of SIGTERM")
			return nil
		}
	}
}

// The exit status says whether state was lost: a client trickling a body
// at SIGTERM is cut after -shutdown-grace and the exit is clean (it was
// 2), a final save that fails is an error (it exited 0).
func TestServeExitStatus(t *testing.T) {
	base, stop := startServeErr(t, "-shutdown-grace", "300ms")
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	if err := stop(); err != nil {
		t.Fatalf("a trickling client made the exit an error: %v", err)
	}

	dir := filepath.Join(t.TempDir(), "state")
	_, stop = startServeErr(t, "-state", dir, "-save-every", "0")
	// The state directory becomes a file: the final save cannot be made.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err == nil || !strings.Contains(err.Error(), "state may be lost") {
		t.Fatalf("a failed final save: %v, want an error saying state may be lost", err)
	}
}

// With -nats embedded, `kvradix serve` starts a NATS server of its own
// (in -state DIR/nats) and follows it; an engine registered is indexed
// through it; a restart on the same directory serves the index again from
// the bus.
func TestServeOnEmbeddedNATS(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	dir := t.TempDir()
	stored := vllm.Event{Type: vllm.BlockStored, BlockHashes: []uint64{41}, TokenIDs: make([]uint32, 16), BlockSize: 16, Medium: "GPU"}
	held := func(base string, publish bool) bool {
		if publish {
			pub.Publish([]vllm.Event{stored})
		}
		resp, err := http.Post(base+"/query", "application/json", strings.NewReader(`{"model_name": "m", "token_ids": [`+strings.Repeat("0,", 15)+`0]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got struct{ Scores map[string]map[string]int }
		json.NewDecoder(resp.Body).Decode(&got)
		return got.Scores["3"]["0"] == 16
	}
	base, stop := startServe(t, "-nats", "embedded", "-state", dir, "-workers", "3="+pub.Addr(), "-model-name", "m")
	testwait.For(t, "the engine's block indexed through the bus", func() bool { return held(base, true) })
	stop()
	if _, err := os.Stat(dir + "/nats/auth-token"); err != nil {
		t.Fatalf("the embedded server's directory: %v", err)
	}
	base, stop = startServe(t, "-nats", "embedded", "-state", dir)
	defer stop()
	testwait.For(t, "the restarted service to serve the block from the bus", func() bool { return held(base, false) })
}

// With -nats embedded and no -state, the server's temporary directory
// goes when the service stops.
func TestEmbeddedNATSLeavesNoDirectory(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	_, stop := startServe(t, "-nats", "embedded")
	if dirs, _ := filepath.Glob(filepath.Join(tmp, "kvradix-nats-*")); len(dirs) != 1 {
		t.Fatalf("the embedded server's directories: %v, want one", dirs)
	}
	stop()
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Fatalf("%s left behind", left[0].Name())
	}
}

// One -state directory serves one service at a time: a second is refused
// at start, naming the first's pid. Two would remove each other's
// snapshots (each save removes other generations' files) and leave a
// state the next start refuses.
func TestStateDirLocked(t *testing.T) {
	dir := t.TempDir()
	_, stop := startServe(t, "-state", dir)
	second := make(chan os.Signal, 1)
	second <- syscall.SIGTERM // taken by mistake: it starts and stops at once
	err := run([]string{"serve", "-listen", "127.0.0.1:0", "-state", dir}, io.Discard, io.Discard, second)
	if want := fmt.Sprintf("in use by another kvradix serve (pid %d)", os.Getpid()); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a second service on the state: %v, want %q", err, want)
	}
	stop()
	_, stop = startServe(t, "-state", dir) // free once the first has stopped
	stop()
}

// While the service recovers, here from a peer that never answers, it
// answers: /health that it lives, /ready that it is recovering, queries
// what is back so far, and a registration 503. A stop signal then stops
// it: the recovery is abandoned. The service used to answer nothing until
// the recovery ended, and to ignore SIGTERM until the peer's five minutes
// were up, and then the next peer's.
func TestServesWhileRecoveringFromPeers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	asked := make(chan net.Conn, 1)
	go func() { // a peer that takes the connection and never answers
		if c, err := ln.Accept(); err == nil {
			asked <- c
		}
	}()
	stop := make(chan os.Signal, 1)
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"serve", "-listen", "127.0.0.1:0", "-peers", "http://" + ln.Addr().String()}, w, io.Discard, stop)
		w.Close()
	}()
	said := make(chan string, 64)
	go func() {
		defer close(said)
		for lines := bufio.NewScanner(out); lines.Scan(); {
			said <- lines.Text()
		}
	}()
	base := ""
	for base == "" {
		select {
		case l := <-said:
			if _, addr, ok := strings.Cut(l, "serving on "); ok {
				base = strings.TrimSpace(addr)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("not serving 30 s after the start, while recovering")
		}
	}
	select {
	case c := <-asked:
		defer c.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the peer was never asked for its dump")
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		method, path string
		want         int
		says         string
	}{
		{"GET", "/health", http.StatusOK, "ok"},
		{"GET", "/ready", http.StatusServiceUnavailable, "recovering"},
		{"POST", "/register", http.StatusServiceUnavailable, "recovering"},
		{"GET", "/dump", http.StatusServiceUnavailable, "recovering"},   // a peer would take a part for the whole
		{"POST", "/query", http.StatusUnprocessableEntity, "token_ids"}, // through to the service
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s while recovering: %v", tc.method, tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s %s while recovering: %d %s, want %d saying %q", tc.method, tc.path, resp.StatusCode, body, tc.want, tc.says)
		}
	}
	client.CloseIdleConnections()
	stop <- syscall.SIGTERM
	select {
	case err := <-done:
		var all []string
		for l := range said {
			all = append(all, l)
		}
		if err != nil || !slices.Contains(all, "kvradix: stopped while recovering") {
			t.Fatalf("%v, said %q", err, all)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still recovering 30 s after SIGTERM")
	}
}

// Bad flags are refused before anything starts, each naming the flag:
// none is taken silently as its default, none panics (-ttl 1ns did), none
// runs the service in a loop (-save-every 1ns saved 1,500 times a second).
func TestServeBadFlags(t *testing.T) {
	tmp := t.TempDir() // where an embedded NATS server would make its directory
	t.Setenv("TMPDIR", tmp)
	defer func() {
		if left, _ := os.ReadDir(tmp); len(left) > 0 {
			t.Errorf("a refused flag left %s behind: something started", left[0].Name())
		}
	}()
	var peers []string
	for i := range serve.MaxPeers + 1 {
		peers = append(peers, fmt.Sprintf("http://p%d:1", i))
	}
	manyPeers := strings.Join(peers, ",")
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{}, "serve"},
		{[]string{"serve", "-workers", "3=tcp://x:1"}, "-model-name"},
		{[]string{"serve", "-workers", "x=tcp://x:1", "-model-name", "m"}, "-workers"},
		{[]string{"serve", "-listen", "nonsense"}, "-listen"},
		{[]string{"serve", "-ttl", "1ns"}, "-ttl"},
		{[]string{"serve", "-ttl", "-5s"}, "-ttl"},
		{[]string{"serve", "-save-every", "1ns"}, "-save-every"},
		{[]string{"serve", "-save-every", "-1s"}, "-save-every"},
		{[]string{"serve", "-lanes", "-3"}, "-lanes"},
		{[]string{"serve", "-lanes", "0"}, "-lanes"},
		{[]string{"serve", "-lanes", "100000"}, "-lanes"},
		{[]string{"serve", "-index-blocks", "-1"}, "-index-blocks"},
		{[]string{"serve", "-index-blocks", "100000000"}, "-index-blocks"},
		{[]string{"serve", "-max-body", "-1"}, "-max-body"},
		{[]string{"serve", "-max-body", "99999999999"}, "-max-body"},
		{[]string{"serve", "-max-routed-blocks", "0"}, "-max-routed-blocks"},
		{[]string{"serve", "-max-indexes", "0"}, "-max-indexes"},
		{[]string{"serve", "-max-instances", "-1"}, "-max-instances"},
		{[]string{"serve", "-peer-idle-timeout", "0s"}, "-peer-idle-timeout"},
		{[]string{"serve", "-peers", manyPeers}, "65 peers, at most 64"},
		{[]string{"serve", "-max-routed-blocks", "99999999999"}, "-max-routed-blocks"},
		{[]string{"serve", "-nats-max-age", "1h"}, "-nats-max-age without -nats"},
		{[]string{"serve", "-nats-creds", "/x.creds", "-nats-max-bytes", "9"}, "-nats-creds, -nats-max-bytes without -nats"},
		{[]string{"serve", "-nats", "embedded", "-nats-max-age", "1s"}, "-nats-max-age 1s"},
		{[]string{"serve", "-nats", "embedded", "-nats-max-bytes", "-1"}, "-nats-max-bytes -1"},
		{[]string{"serve", "-block-size", "0"}, "-block-size"},
		{[]string{"serve", "-peers", "http://a:1,ftp://b"}, "-peers"},
		{[]string{"serve", "-block-size", "4294967312"}, "-block-size"},
		{[]string{"serve", "-nats-token-file", "/nonexistent/token", "-nats", "nats://127.0.0.1:1"}, "-nats-token-file"},
		{[]string{"serve", "-ttl", "1ns", "-tiers", "false"}, `unexpected argument "false"`}, // before the flags it cut off
		// each of these was taken: the service ran, and the flag showed its fault later or never
		{[]string{"serve", "-listen", ""}, "-listen: empty"}, // listened on every interface
		{[]string{"serve", "-token", "s3cret "}, "-token"},   // no caller could have been let in
		{[]string{"serve", "-token", "a\nb"}, "-token"},
		{[]string{"serve", "-state", file}, "-state"}, // the state lost on shutdown
		{[]string{"serve", "-state", filepath.Join(file, "sub")}, "-state"},
		{[]string{"serve", "-peers", "http://a:1,http://a:1/"}, "http://a:1 given twice"},
		{[]string{"serve", "-peers", "http://a:1,"}, "-peers"},
		{[]string{"serve", "-peers", "http://a:99999"}, "port 99999"},
		{[]string{"serve", "-workers", "1=tcp://a:1 2=tcp://b:1", "-model-name", "m"}, "a space"}, // dialled forever
		{[]string{"serve", "-workers", "1=tcp://*:5557", "-model-name", "m"}, "the engine's host"},
		{[]string{"serve", "-workers", "1=tcp://a:70000", "-model-name", "m"}, "port"},
		{[]string{"serve", "-workers", "1=tcp://a:1,1=tcp://b:1", "-model-name", "m"}, "instance 1 given twice"},
		{[]string{"serve", "-nats", "embedded", "-nats-token-file", file}, "-nats-token-file with -nats embedded"}, // it was ignored
		{[]string{"serve", "-peers", "http://"}, `url: "http://"`},
	} {
		stop := make(chan os.Signal, 1)
		stop <- syscall.SIGTERM // a flag taken by mistake: the service starts and stops at once
		err := run(tc.args, io.Discard, io.Discard, stop)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.says)
		}
	}
}

// Help asked for is no error: it goes to stdout, and the command exits 0
// (kvradix -h, kvradix help, kvradix serve -h).
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-h"}, "usage: kvradix serve"},
		{[]string{"--help"}, "usage: kvradix serve"},
		{[]string{"help"}, "usage: kvradix serve"},
		{[]string{"serve", "-h"}, "-listen"},
		{[]string{"serve", "-lanes", "4", "--help"}, "-tiers"},
	} {
		var out, errs strings.Builder
		if err := run(tc.args, &out, &errs, nil); err != nil || !strings.Contains(out.String(), tc.says) {
			t.Errorf("%v: %v, stdout %q (stderr %q), want no error and %q", tc.args, err, out.String(), errs.String(), tc.says)
		}
	}
}

// No command links package testing (nor test helpers): the reference the
// load generator and the service check indexes against lives in
// radix/holdings, not in radixtest.
func TestNoBinaryLinksTesting(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/kvradix/kvradix/cmd/...").Output()
	if err != nil {
		t.Skipf("go list: %v", err) // no go tool where the test runs
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasSuffix(pkg, "/radixtest") || strings.Contains(pkg, "goleak") {
			t.Errorf("a command links %s", pkg)
		}
	}
}

// Losses are logged at most once per engine per interval; the lines held
// back are counted in the next.
func TestLossLog(t *testing.T) {
	var out strings.Builder
	l := newLossLog(&out, time.Hour)
	a := vllm.Loss{Worker: 1, Address: "tcp://a:1", First: 5, Last: 5, Events: 1, Reason: "event 1: block_hashes[0]: bad"}
	l.log(a)
	l.log(a)
	l.log(a)
	l.log(vllm.Loss{Worker: 2, Address: "tcp://b:1", First: 1, Last: 3, Reason: "replay timed out"})
	l.every = 0
	l.log(a)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "tcp://a:1") || !strings.Contains(lines[0], "1 events lost") ||
		!strings.Contains(lines[1], "lost batches 1..3") || !strings.Contains(lines[2], "and 2 more") {
		t.Fatalf("log:\n%s", out.String())
	}
}

// The bus's token never shows in an error: not from the URL, not from the
// file or the environment it is read from.
func TestNATSTokenIsNeverEchoed(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("s3cret-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"serve", "-nats", "nats://s3cret-url@127.0.0.1:1"},
		{"serve", "-nats", "nats://127.0.0.1:1", "-nats-token-file", file},
	} {
		err := run(args, io.Discard, io.Discard, nil)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: %v", args, err)
		}
	}
	a, err := natsAuth("", file, "s3cret-env")
	if err != nil || a.Token != "s3cret-file" {
		t.Fatalf("the file's token: %+v %v", a, err)
	}
	if a, _ := natsAuth("", "", " s3cret-env\n"); a.Token != "s3cret-env" {
		t.Fatalf("the environment's token: %+v", a)
	}
}
