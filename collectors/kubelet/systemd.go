package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/nodevigil/nodevigil/collectors"
)

// Reconnect backoff for the systemd bus. Checks run every few seconds; a host without a
// reachable bus (no socket mounted, no systemd) is retried at most every five minutes so it
// costs nothing, and a bus that went away briefly (systemd re-exec, dbus restart) is back
// within seconds.
const (
	busInitialBackoff = 5 * time.Second
	busMaxBackoff     = 5 * time.Minute
)

// kindQueryFailed is the busError kind of a connected bus whose property query failed.
const kindQueryFailed = "query failed"

// unitState is what systemd says about the kubelet unit.
type unitState struct {
	LoadState   string // loaded, not-found, masked, ...
	ActiveState string // active, reloading, inactive, failed, activating, deactivating
	SubState    string // running, auto-restart, dead, ...
	Result      string // success, exit-code, signal, core-dump, oom-kill, start-limit-hit, ...
	NRestarts   uint32 // automatic restarts since the unit was last started by hand
	// HasNRestarts is false on systemd older than 235 (Amazon Linux 2 ships 219), which has
	// no NRestarts property; restarts are then counted from MainPID and MainStart changes.
	HasNRestarts bool
	MainPID      uint32 // the service's main process, 0 when none
	MainStart    uint64 // ExecMainStartTimestamp, µs since the epoch; changes on every start; 0 if never started since boot
	// MainExit is ExecMainExitTimestamp (µs since the epoch, 0 while the process runs or if it
	// never ran) and ActiveExit is ActiveExitTimestamp: when the unit last left the active
	// state. Their order tells who ended the last run (see stoppedByJob).
	MainExit   uint64
	ActiveExit uint64
	// MainCode and MainStatus are ExecMainCode (1 exited, 2 killed, 3 dumped core) and
	// ExecMainStatus (the exit status or the signal) of the last main process.
	MainCode   int32
	MainStatus int32
	// JobID is the job systemd has queued or running for the unit (Unit.Job; 0 for none) and
	// JobType its type ("stop", "start", "restart", ...), from Manager.ListJobs; "" when the
	// job was gone before it could be listed.
	JobID   uint32
	JobType string
}

// stoppedByJob reports whether systemd's own timestamps show that the unit's last run was
// ended by a stop job (systemctl stop, or a stop propagated from a unit it requires) rather
// than by its process exiting on its own: a stop job first takes the unit out of the active
// state (ActiveExitTimestamp) and then signals the process, which exits after
// (ExecMainExitTimestamp later); a process that exits on its own exits first and the unit
// leaves the active state after. The process must have been started before the unit left
// the active state, so a later run that failed before becoming active is not mistaken for
// the stopped one. This is what the agent can still see when it starts after the stop.
func stoppedByJob(st unitState) bool {
	return st.ActiveExit != 0 && st.MainStart != 0 && st.MainStart <= st.ActiveExit && st.MainExit > st.ActiveExit
}

// neverStarted reports whether systemd has no record of the unit's process having been
// started since boot.
func neverStarted(st unitState) bool {
	return st.MainStart == 0 && st.ActiveExit == 0
}

// busError says why systemd could not be asked. Kind is a short human phrase used in
// messages ("socket missing"); it is also what "log once" keys on.
type busError struct {
	Kind string
	Err  error
}

func (e *busError) Error() string {
	return "systemd not reachable over D-Bus: " + e.Kind + ": " + e.Err.Error()
}

func (e *busError) Unwrap() error { return e.Err }

// systemdBus owns one lazily opened go-systemd connection to a bus address, reconnects with
// backoff when it breaks, and logs reachability only when it changes, so a node without a
// bus socket produces one log line instead of one per check.
type systemdBus struct {
	addr   string
	check  string
	now    func() time.Time
	logger *slog.Logger

	// lifetime bounds every connection; cancelled by close.
	lifetime context.Context
	cancel   context.CancelFunc

	// sem serialises connection management; a channel so waiting honours the caller's ctx.
	sem       chan struct{}
	conn      *sddbus.Conn
	nextDial  time.Time
	backoff   time.Duration
	lastErr   *busError
	loggedErr string // Kind of the last failure logged; "" after a success was logged
	closed    bool
}

func newSystemdBus(addr, check string, now func() time.Time, logger *slog.Logger) *systemdBus {
	ctx, cancel := context.WithCancel(context.Background())
	return &systemdBus{
		addr:     addr,
		check:    check,
		now:      now,
		logger:   logger,
		lifetime: ctx,
		cancel:   cancel,
		sem:      make(chan struct{}, 1),
	}
}

// get returns a live connection, dialling when there is none and the backoff allows. While
// backing off it returns the last failure without touching the bus.
func (b *systemdBus) get(ctx context.Context) (*sddbus.Conn, error) {
	select {
	case b.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, &busError{Kind: "timed out", Err: ctx.Err()}
	}
	defer func() { <-b.sem }()

	if b.closed {
		return nil, &busError{Kind: "closed", Err: errors.New("collector closed")}
	}
	if b.conn != nil {
		if b.conn.Connected() {
			return b.conn, nil
		}
		b.conn.Close()
		b.conn = nil
		b.logger.Warn("systemd bus connection lost", "check", b.check)
	}
	now := b.now()
	if b.lastErr != nil && now.Before(b.nextDial) {
		return nil, b.lastErr
	}
	conn, err := dialSystemd(ctx, b.addr, b.lifetime)
	if err != nil {
		berr := classifyBusError(err)
		if b.backoff == 0 {
			b.backoff = busInitialBackoff
		} else {
			b.backoff = min(2*b.backoff, busMaxBackoff)
		}
		b.nextDial = now.Add(b.backoff)
		b.lastErr = berr
		if b.loggedErr != berr.Kind {
			b.loggedErr = berr.Kind
			b.logger.Warn("systemd bus unreachable", "check", b.check, "reason", berr.Kind, "err", err)
		}
		return nil, berr
	}
	if b.loggedErr != "" {
		b.logger.Info("systemd bus reachable again", "check", b.check)
	}
	b.conn, b.lastErr, b.loggedErr, b.backoff = conn, nil, "", 0
	return conn, nil
}

// drop closes conn if it is still the current connection, so the next call redials. Called
// after a failed call on a connection that no longer reports itself connected.
func (b *systemdBus) drop(conn *sddbus.Conn) {
	b.sem <- struct{}{}
	defer func() { <-b.sem }()
	if b.conn == conn && !conn.Connected() {
		b.conn.Close()
		b.conn = nil
	}
}

func (b *systemdBus) close() error {
	b.sem <- struct{}{}
	defer func() { <-b.sem }()
	b.closed = true
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
	b.cancel()
	return nil
}

// dialSystemd opens a go-systemd connection (two bus connections: calls and signals) to addr,
// bounded by ctx. godbus's Auth and Hello and go-systemd's AddMatch block without a context,
// so the whole handshake runs in a goroutine and, if ctx ends first, the raw connections are
// closed under it, which unblocks it; nothing outlives the call for long. The connections
// themselves live until lifetime ends.
func dialSystemd(ctx context.Context, addr string, lifetime context.Context) (*sddbus.Conn, error) {
	var (
		mu        sync.Mutex
		raw       []*godbus.Conn
		abandoned bool
	)
	dial := func() (*godbus.Conn, error) {
		c, err := godbus.Dial(addr, godbus.WithContext(lifetime))
		if err != nil {
			return nil, err
		}
		mu.Lock()
		if abandoned {
			mu.Unlock()
			c.Close()
			return nil, context.Canceled
		}
		raw = append(raw, c)
		mu.Unlock()
		// EXTERNAL with the numeric uid, like go-systemd itself: no user database lookup.
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, fmt.Errorf("authenticate: %w", err)
		}
		if err := c.Hello(); err != nil {
			c.Close()
			return nil, fmt.Errorf("hello: %w", err)
		}
		return c, nil
	}
	type result struct {
		conn *sddbus.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := sddbus.NewConnection(dial)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		if ctx.Err() != nil || !r.conn.Connected() {
			r.conn.Close()
			return nil, errors.Join(ctx.Err(), errors.New("connection closed during handshake"))
		}
		return r.conn, nil
	case <-ctx.Done():
		mu.Lock()
		abandoned = true
		for _, c := range raw {
			c.Close()
		}
		mu.Unlock()
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// classifyBusError names the failure in operator terms.
func classifyBusError(err error) *busError {
	kind := "connection failed"
	switch {
	case errors.Is(err, syscall.ENOENT):
		kind = "socket missing"
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = "socket not accepting connections"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		kind = "permission denied"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		kind = "timed out"
	}
	wrapped := err
	if kind == "socket missing" {
		// A host without the bus socket cannot provide this signal at all; the agent uses
		// ErrNotSupported to avoid alerting on it every cycle.
		wrapped = fmt.Errorf("%w: %w", collectors.ErrNotSupported, err)
	}
	return &busError{Kind: kind, Err: wrapped}
}

// systemdUnit reads and restarts one unit through a systemdBus.
type systemdUnit struct {
	bus  *systemdBus
	unit string
	// onChange, when set, receives the unit's state every time systemd signals a change of
	// its properties (PropertiesChanged over D-Bus), so restarts, OOM kills and crash loops
	// between two checks are seen even with RestartSec=5.
	onChange func(unitState)

	watchMu  sync.Mutex
	watching *sddbus.Conn // the connection the current watcher follows
	// unwatch ends the current watcher; closed when the checks move to a new connection.
	unwatch chan struct{}
}

// signalReadTimeout bounds the property read that follows a change signal.
const signalReadTimeout = 2 * time.Second

// watch follows the unit's PropertiesChanged signals (Unit and Service interfaces) on a
// connection of its own, once per call connection, until that connection or the bus is
// closed. It runs in the background so a check never waits for it. It does not use
// go-systemd's subscriber, whose dispatcher reads the subscriber fields without a lock.
func (s *systemdUnit) watch(conn *sddbus.Conn) {
	if s.onChange == nil {
		return
	}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watching == conn {
		return
	}
	if s.unwatch != nil {
		close(s.unwatch) // the old connection was dropped: its watcher ends
	}
	s.watching, s.unwatch = conn, make(chan struct{})
	go s.follow(conn, s.unwatch)
}

// follow ends when the bus is closed, when the signal connection ends, or when the checks
// move to a new call connection (unwatch), which is how a dead call connection ends it: a
// check that fails on it drops it, and the next check's watch starts over on the new one.
// No liveness timer: an idle agent's CPU is mostly its wake-ups (collectors/wakeup).
func (s *systemdUnit) follow(conn *sddbus.Conn, unwatch <-chan struct{}) {
	raw, err := godbus.Dial(s.bus.addr, godbus.WithContext(s.bus.lifetime))
	if err == nil {
		err = raw.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))})
		if err == nil {
			err = raw.Hello()
		}
		if err != nil {
			raw.Close()
		}
	}
	if err != nil {
		s.bus.logger.Warn("subscribe to systemd signals failed; unit changes are seen at checks only", "check", s.bus.check, "err", err)
		return
	}
	defer raw.Close()
	// Listen before matching and subscribing, so no signal sent in between is dropped.
	signals := make(chan *godbus.Signal, 64)
	raw.Signal(signals)
	path := godbus.ObjectPath("/org/freedesktop/systemd1/unit/" + sddbus.PathBusEscape(s.unit))
	if err := raw.AddMatchSignal(godbus.WithMatchObjectPath(path), godbus.WithMatchInterface("org.freedesktop.DBus.Properties"),
		godbus.WithMatchMember("PropertiesChanged")); err != nil {
		s.bus.logger.Warn("subscribe to systemd signals failed; unit changes are seen at checks only", "check", s.bus.check, "err", err)
		return
	}
	// JobNew names the unit a job was queued for: a stop job for the kubelet is how an
	// operator's systemctl stop is told from a kubelet that exited on its own.
	if err := raw.AddMatchSignal(godbus.WithMatchObjectPath(managerPath), godbus.WithMatchInterface(managerIface),
		godbus.WithMatchMember("JobNew")); err != nil {
		s.bus.logger.Warn("subscribe to systemd signals failed; unit changes are seen at checks only", "check", s.bus.check, "err", err)
		return
	}
	// systemd emits unit signals only while some client is subscribed.
	if call := raw.Object("org.freedesktop.systemd1", managerPath).Call(managerIface+".Subscribe", 0); call.Err != nil {
		s.bus.logger.Warn("subscribe to systemd signals failed; unit changes are seen at checks only", "check", s.bus.check, "err", call.Err)
		return
	}
	for {
		select {
		case <-s.bus.lifetime.Done():
			return
		case <-unwatch:
			return
		case sig, ok := <-signals:
			if !ok {
				return
			}
			if !s.concerns(sig, path) {
				continue
			}
			ctx, cancel := context.WithTimeout(s.bus.lifetime, signalReadTimeout)
			st, err := s.readWith(ctx, conn)
			cancel()
			if err == nil {
				// The signal carries Result as it was at the change; the read comes later and
				// may find the unit already restarted, its Result reset to success by the start
				// (RestartSec can be well under the read's latency on a loaded node).
				if r := changedResult(sig); r != "" && r != "success" {
					st.Result = r
				}
				s.onChange(st)
			}
		}
	}
}

// changedResult returns the Result a PropertiesChanged signal carries, or "" when it carries
// none.
func changedResult(sig *godbus.Signal) string {
	if sig.Name != "org.freedesktop.DBus.Properties.PropertiesChanged" || len(sig.Body) < 2 {
		return ""
	}
	changed, ok := sig.Body[1].(map[string]godbus.Variant)
	if !ok {
		return ""
	}
	v, ok := changed["Result"]
	if !ok {
		return ""
	}
	r, _ := v.Value().(string)
	return r
}

// systemd's manager object, which emits the job signals.
const (
	managerPath  = godbus.ObjectPath("/org/freedesktop/systemd1")
	managerIface = "org.freedesktop.systemd1.Manager"
)

// concerns reports whether a signal is about the unit: a change of its properties, or a job
// queued for it (JobNew's third argument is the unit's name).
func (s *systemdUnit) concerns(sig *godbus.Signal, path godbus.ObjectPath) bool {
	if sig.Path == path {
		return true
	}
	if sig.Path == managerPath && sig.Name == managerIface+".JobNew" && len(sig.Body) == 3 {
		unit, _ := sig.Body[2].(string)
		return unit == s.unit
	}
	return false
}

// readUnit fetches the Unit and Service properties of the unit (two GetAll calls), and
// makes sure the connection's change signals are followed.
func (s *systemdUnit) readUnit(ctx context.Context) (unitState, error) {
	conn, err := s.bus.get(ctx)
	if err != nil {
		return unitState{}, err
	}
	s.watch(conn)
	return s.readWith(ctx, conn)
}

func (s *systemdUnit) readWith(ctx context.Context, conn *sddbus.Conn) (unitState, error) {
	u, err := conn.GetUnitPropertiesContext(ctx, s.unit)
	if err != nil {
		s.bus.drop(conn)
		return unitState{}, &busError{Kind: kindQueryFailed, Err: fmt.Errorf("read properties of %s: %w", s.unit, err)}
	}
	st := unitState{
		LoadState:   stringProp(u, "LoadState"),
		ActiveState: stringProp(u, "ActiveState"),
		SubState:    stringProp(u, "SubState"),
		ActiveExit:  uint64Prop(u, "ActiveExitTimestamp"),
		JobID:       jobID(u["Job"]),
	}
	if st.LoadState == "not-found" {
		return st, nil
	}
	svc, err := conn.GetUnitTypePropertiesContext(ctx, s.unit, "Service")
	if err != nil {
		s.bus.drop(conn)
		return unitState{}, &busError{Kind: kindQueryFailed, Err: fmt.Errorf("read service properties of %s: %w", s.unit, err)}
	}
	st.Result = stringProp(svc, "Result")
	if n, ok := svc["NRestarts"].(uint32); ok {
		st.NRestarts, st.HasNRestarts = n, true
	}
	st.MainPID, _ = svc["MainPID"].(uint32)
	st.MainStart = uint64Prop(svc, "ExecMainStartTimestamp")
	st.MainExit = uint64Prop(svc, "ExecMainExitTimestamp")
	st.MainCode, _ = svc["ExecMainCode"].(int32)
	st.MainStatus, _ = svc["ExecMainStatus"].(int32)
	if st.JobID != 0 {
		// Rare (a job is queued or running for the kubelet) and cheap: one call for its type.
		jobs, err := conn.ListJobsContext(ctx)
		if err != nil {
			s.bus.drop(conn)
			return unitState{}, &busError{Kind: kindQueryFailed, Err: fmt.Errorf("list systemd jobs for %s: %w", s.unit, err)}
		}
		for _, j := range jobs {
			if j.Id == st.JobID {
				st.JobType = j.JobType
			}
		}
	}
	return st, nil
}

// jobID is the id of a Unit.Job property, a (uo) struct: (0, "/") when no job is queued.
func jobID(v any) uint32 {
	switch j := v.(type) {
	case []any:
		if len(j) == 2 {
			id, _ := j[0].(uint32)
			return id
		}
	case []uint32:
		if len(j) > 0 {
			return j[0]
		}
	}
	return 0
}

func uint64Prop(m map[string]any, name string) uint64 {
	v, _ := m[name].(uint64)
	return v
}

// restartUnit clears a failed state (so a unit that hit its start limit can start again)
// and restarts the unit in "replace" mode, waiting for the job to finish. It returns the
// job result: done, canceled, timeout, failed, dependency or skipped.
func (s *systemdUnit) restartUnit(ctx context.Context, resetFailed bool) (string, error) {
	conn, err := s.bus.get(ctx)
	if err != nil {
		return "", err
	}
	if resetFailed {
		if err := conn.ResetFailedUnitContext(ctx, s.unit); err != nil {
			s.bus.logger.Warn("reset-failed before restart failed", "check", s.bus.check, "err", err)
		}
	}
	// Buffered: go-systemd writes the result while holding its job lock, and we may have
	// stopped listening when ctx ended.
	ch := make(chan string, 1)
	if _, err := conn.RestartUnitContext(ctx, s.unit, "replace", ch); err != nil {
		s.bus.drop(conn)
		return "", fmt.Errorf("restart %s: %w", s.unit, err)
	}
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		return "", fmt.Errorf("wait for restart job of %s: %w", s.unit, ctx.Err())
	}
}

func (s *systemdUnit) close() error { return s.bus.close() }

func stringProp(m map[string]any, name string) string {
	s, _ := m[name].(string)
	return s
}
