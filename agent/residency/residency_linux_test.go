//go:build linux

package residency

import (
	"os"
	"strings"
	"testing"
)

// TestParseSmaps: only the executable's private read-only mappings are released: never a
// writable one (its pages hold state), a shared one, another file's or an anonymous one.
func TestParseSmaps(t *testing.T) {
	data, err := os.ReadFile("testdata/smaps")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ino  uint64
		want []mapping
	}{
		{"the agent's text and read-only data", 9995076, []mapping{
			{start: 0x400000, end: 0xccd000, perms: "r-xp", inode: 9995076, rss: 7412 << 10},
			{start: 0xccd000, end: 0x15c4000, perms: "r--p", inode: 9995076, rss: 7516 << 10},
		}},
		{"another file", 1234, []mapping{
			{start: 0x7f413f6a0000, end: 0x7f413f6a2000, perms: "r--p", inode: 1234, rss: 8 << 10},
		}},
		{"no such file", 42, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSmaps(data, tc.ino)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d mappings %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("mapping %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestParseSmapsRejectsBadInput(t *testing.T) {
	tests := []struct{ name, smaps, want string }{
		{"bad range", "zz-0040 r-xp 00000000 fe:00 7 /bin/x\n", "bad address range"},
		{"bad rss", "00400000-00401000 r-xp 00000000 fe:00 7 /bin/x\nRss: many kB\n", "bad Rss line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseSmaps([]byte(tc.smaps), 7); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestReleaseDropsTheBinarysPages runs Release on this test binary: most of its mapped text
// and read-only data is no longer mapped afterwards, and the code still runs (the pages it
// needs are mapped again on use).
func TestReleaseDropsTheBinarysPages(t *testing.T) {
	st, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	if st.Mappings < 2 {
		t.Errorf("released %d mappings, want the text and the read-only data (at least 2)", st.Mappings)
	}
	if st.Before < 1<<20 {
		t.Fatalf("only %d bytes of the binary were mapped before; the test cannot tell", st.Before)
	}
	if st.After > st.Before/2 {
		t.Errorf("binary resident %d bytes before, %d after: want less than half", st.Before, st.After)
	}
	t.Logf("binary resident: %d KiB before, %d KiB after", st.Before>>10, st.After>>10)
	// Still working: a second release reads /proc and parses again.
	if _, err := Release(); err != nil {
		t.Fatal(err)
	}
}
