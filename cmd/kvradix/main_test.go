package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvradix/kvradix/ingest/vllm"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// `kvradix serve` starts with an engine from -workers, answers over HTTP,
// guards registration with -token, and on SIGTERM stops gracefully.
func TestServeCommand(t *testing.T) {
	pub, err := vllm.NewPublisher(vllm.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@e@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	out, w := io.Pipe()
	stop := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"serve", "-listen", "127.0.0.1:0", "-workers", "3=" + pub.Addr(), "-model-name", "m", "-token", "s3cret"}, w, io.Discard, stop)
		w.Close()
	}()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.Contains(lines.Text(), "serving on http://") {
		t.Fatalf("first line %q", lines.Text())
	}
	base := strings.TrimSpace(lines.Text()[strings.Index(lines.Text(), "http://"):])
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
	http.DefaultClient.CloseIdleConnections()
	stop <- syscall.SIGTERM
	go io.Copy(io.Discard, out)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no shutdown within 20 s of SIGTERM")
	}
}

func TestServeBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"serve", "-workers", "3=tcp://x:1"},
		{"serve", "-workers", "x=tcp://x:1", "-model-name", "m"},
		{"serve", "-listen", "nonsense"},
	} {
		if err := run(args, io.Discard, io.Discard, nil); err == nil {
			t.Errorf("%v: accepted", args)
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
