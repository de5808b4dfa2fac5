package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// leaderLease is the remediator's leader election Lease (remediation.DefaultLeaseName).
const leaderLease = "nodevigil-remediator"

// restartPause is how long a killed replica stays down before it is started again, as a
// Deployment's pod would be recreated.
const restartPause = 3 * time.Second

// replica is one remediator process of make run, and how to start it again.
type replica struct {
	name   string // also its POD_NAME: the leader Lease's holder is name + "_" + suffix
	listen string
	args   []string
	env    []string

	mu     sync.Mutex
	c      *child
	killed bool // killed on purpose (restartLeader): start it again instead of stopping make run
}

// replicaSet runs make run's remediator replicas the way their Deployment would: each leader
// elected through the Lease; one killed on purpose (fleetctl restart-leader, scenario S003) is
// started again after a pause, so the user watches the other take over and the killed one
// come back as a follower. Any other exit ends make run, with the error.
type replicaSet struct {
	term     *terminal
	bin      string
	client   kubernetes.Interface
	ns       string
	replicas []*replica
	exited   chan error // unexpected exits
	done     chan struct{}
}

func newReplicaSet(term *terminal, bin string, client kubernetes.Interface, ns string) *replicaSet {
	return &replicaSet{term: term, bin: bin, client: client, ns: ns, exited: make(chan error, 4), done: make(chan struct{})}
}

// start runs a replica and supervises it.
func (s *replicaSet) start(name, listen string, args, env []string) error {
	r := &replica{name: name, listen: listen, args: args, env: append(env, "POD_NAME="+name)}
	if err := s.run(r); err != nil {
		return err
	}
	s.replicas = append(s.replicas, r)
	return nil
}

func (s *replicaSet) run(r *replica) error {
	c, err := startChild(s.term, r.name, s.bin, append(append([]string(nil), r.args...), "--listen-address", r.listen), r.env...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.c, r.killed = c, false
	r.mu.Unlock()
	go s.supervise(r, c)
	return nil
}

func (s *replicaSet) supervise(r *replica, c *child) {
	var err error
	select {
	case err = <-c.exited:
	case <-s.done:
		return
	}
	r.mu.Lock()
	killed := r.killed
	r.mu.Unlock()
	if !killed {
		select {
		case s.exited <- fmt.Errorf("%s exited: %w", r.name, err):
		case <-s.done:
		}
		return
	}
	select {
	case <-time.After(restartPause):
	case <-s.done:
		return
	}
	slog.Info("starting the killed remediator replica again", "replica", r.name)
	if err := s.run(r); err != nil {
		s.exited <- err
	}
}

// restartLeader SIGKILLs the replica holding the leader Lease (no release, as a crash or an
// OOM kill would leave it) and starts it again after a pause. It returns who was killed.
func (s *replicaSet) restartLeader(ctx context.Context) (string, error) {
	if len(s.replicas) < 2 {
		return "", errors.New("make run runs one remediator replica (no fleet): there is no other to take over")
	}
	l, err := s.client.CoordinationV1().Leases(s.ns).Get(ctx, leaderLease, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the leader Lease %s/%s: %w", s.ns, leaderLease, err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", errors.New("no replica holds the leader Lease yet; try again in a few seconds")
	}
	holder := *l.Spec.HolderIdentity
	for _, r := range s.replicas {
		if !strings.HasPrefix(holder, r.name+"_") {
			continue
		}
		r.mu.Lock()
		r.killed = true
		c := r.c
		r.mu.Unlock()
		if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return "", fmt.Errorf("kill %s: %w", r.name, err)
		}
		slog.Info("killed the leader remediator replica", "replica", r.name, "identity", holder)
		return r.name, nil
	}
	return "", fmt.Errorf("the leader Lease is held by %q, which is none of make run's replicas", holder)
}

// stop stops every replica.
func (s *replicaSet) stop() {
	close(s.done)
	for _, r := range s.replicas {
		r.mu.Lock()
		c := r.c
		r.mu.Unlock()
		stopChild(r.name, c)
	}
}
