package main

import (
	"bytes"
	"testing"
)

func TestTerminalPrefixesWholeLines(t *testing.T) {
	tests := []struct {
		name   string
		writes []struct{ who, s string }
		close  bool
		want   string
	}{
		{
			name:   "one line",
			writes: []struct{ who, s string }{{"agent", "hello\n"}},
			want:   "agent      | hello\n",
		},
		{
			name:   "two lines in one write",
			writes: []struct{ who, s string }{{"remediator", "a\nb\n"}},
			want:   "remediator | a\nremediator | b\n",
		},
		{
			name: "a partial line is held until its newline, even when another process writes",
			writes: []struct{ who, s string }{
				{"agent", "par"}, {"remediator", "whole\n"}, {"agent", "tial\n"},
			},
			want: "remediator | whole\nagent      | partial\n",
		},
		{
			name:   "close flushes an unterminated last line",
			writes: []struct{ who, s string }{{"agent", "last words"}},
			close:  true,
			want:   "agent      | last words\n",
		},
		{
			name:   "nothing written, nothing printed",
			writes: nil,
			close:  true,
			want:   "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			term := newTerminal(&out, "agent", "remediator")
			ws := map[string]*prefixWriter{"agent": term.writer("agent"), "remediator": term.writer("remediator")}
			for _, w := range tt.writes {
				if n, err := ws[w.who].Write([]byte(w.s)); err != nil || n != len(w.s) {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w.s, n, err, len(w.s))
				}
			}
			if tt.close {
				for _, w := range ws {
					if err := w.Close(); err != nil {
						t.Fatalf("Close: %v", err)
					}
				}
			}
			if got := out.String(); got != tt.want {
				t.Errorf("terminal printed\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}
