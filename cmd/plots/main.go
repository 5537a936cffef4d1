// Command plots draws every plot of package plots from the results
// directory into SVG files beside them (`make plots`).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kvradix/kvradix/plots"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if err != flag.ErrHelp {
			fmt.Fprintln(os.Stderr, "plots:", err)
		}
		os.Exit(2)
	}
}

// run reads each plot's input from -results and writes its SVG to -out.
func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plots", flag.ContinueOnError)
	fs.SetOutput(stderr)
	results := fs.String("results", "results", "`directory` of the results files")
	out := fs.String("out", "", "`directory` for the SVG files (default: the results directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *out == "" {
		*out = *results
	}
	for _, spec := range plots.All {
		src, err := plots.ReadSource(filepath.Join(*results, spec.Input))
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := spec.Render(&buf, src); err != nil {
			return fmt.Errorf("%s: %w", spec.Output, err)
		}
		path := filepath.Join(*out, spec.Output)
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s <- %s\n", path, spec.Input)
	}
	return nil
}
