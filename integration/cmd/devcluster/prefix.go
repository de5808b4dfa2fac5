package main

import (
	"bytes"
	"fmt"
	"io"
	"sync"
)

// terminal serialises the lines of every process `make run` starts onto one writer, each line
// prefixed with the name of the process that wrote it, so interleaved output stays readable
// ("agent      | level=INFO msg=...", "remediator | ..."). Lines are written whole: two
// processes never mix within one line.
type terminal struct {
	mu    sync.Mutex
	out   io.Writer
	width int
}

func newTerminal(out io.Writer, names ...string) *terminal {
	t := &terminal{out: out}
	for _, n := range names {
		t.width = max(t.width, len(n))
	}
	return t
}

// writer returns the writer for one process. Partial lines are held until their newline (or
// until Close), so a line is never split by another process's output.
func (t *terminal) writer(name string) *prefixWriter {
	return &prefixWriter{t: t, prefix: []byte(fmt.Sprintf("%-*s | ", t.width, name))}
}

type prefixWriter struct {
	t      *terminal
	prefix []byte
	mu     sync.Mutex
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if err := w.emit(w.buf[:i+1]); err != nil {
			return len(p), err
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Close writes a last unterminated line, if any.
func (w *prefixWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return nil
	}
	line := append(w.buf, '\n')
	w.buf = nil
	return w.emit(line)
}

func (w *prefixWriter) emit(line []byte) error {
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	if _, err := w.t.out.Write(w.prefix); err != nil {
		return err
	}
	_, err := w.t.out.Write(line)
	return err
}

// block writes a multi-line text unprefixed and in one piece, so the instructions `make run`
// prints are not cut by a process's log line.
func (t *terminal) block(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _ = io.WriteString(t.out, s)
}
