package main

import (
	"errors"
	"io"
	"os"
)

func runIngest(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) error {
	return errors.New("ingest: not yet built")
}
