package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvradix/kvradix/plots"
)

func TestRunWritesEveryPlot(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run([]string{"-results", "../../plots/testdata", "-out", out}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, spec := range plots.All {
		b, err := os.ReadFile(filepath.Join(out, spec.Output))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s is not an SVG", spec.Output)
		}
		if !strings.Contains(stdout.String(), spec.Output) {
			t.Errorf("%s not reported: %s", spec.Output, stdout.String())
		}
	}
}

func TestRunErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-results", t.TempDir()}, "loadgen-sweep.json"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"-nope"}, "not defined"},
	} {
		err := run(tc.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
