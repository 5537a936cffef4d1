package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The README's service walkthrough runs as written: the block between its
// walkthrough markers, with the port moved to a free one and its files
// (the binaries, the state, the query) into a temporary directory.
func TestREADMEWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both commands and runs the service")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the walkthrough needs %s: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "<!-- walkthrough -->\n```sh\n")
	block, _, ok2 := strings.Cut(block, "```\n<!-- /walkthrough -->")
	if !ok || !ok2 {
		t.Fatal("the README has no walkthrough block between its markers")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir := t.TempDir()
	script := strings.NewReplacer("8090", port, "bin/", dir+"/bin/", "kvradix-state", dir+"/state", "query.json", dir+"/query.json").Replace(block)
	// Stop at the first failing command, and never leave the server behind.
	script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the walkthrough failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{"/dump equals the events: true", `"longest_matched":`, `"status":"active"`, `{"status":"ok"}`, "kvradix: stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the walkthrough's output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "state.json")); err != nil {
		t.Errorf("no state saved on SIGTERM: %v", err)
	}
}
