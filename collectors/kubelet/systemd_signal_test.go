package kubelet

import (
	"testing"

	godbus "github.com/godbus/dbus/v5"
)

// TestChangedResult: the Result a PropertiesChanged signal carries is taken from the signal
// itself, so an OOM kill followed at once by systemd's restart (which resets Result) is not
// lost to a read that comes after the restart.
func TestChangedResult(t *testing.T) {
	props := "org.freedesktop.DBus.Properties.PropertiesChanged"
	for _, tc := range []struct {
		name string
		sig  *godbus.Signal
		want string
	}{
		{"oom-kill", &godbus.Signal{Name: props, Body: []any{"org.freedesktop.systemd1.Service", map[string]godbus.Variant{"Result": godbus.MakeVariant("oom-kill")}, []string{}}}, "oom-kill"},
		{"no Result", &godbus.Signal{Name: props, Body: []any{"org.freedesktop.systemd1.Unit", map[string]godbus.Variant{"ActiveState": godbus.MakeVariant("active")}, []string{}}}, ""},
		{"another signal", &godbus.Signal{Name: "org.freedesktop.systemd1.Manager.JobNew", Body: []any{uint32(1), godbus.ObjectPath("/j/1"), "kubelet.service"}}, ""},
		{"malformed body", &godbus.Signal{Name: props, Body: []any{"x"}}, ""},
	} {
		if got := changedResult(tc.sig); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
