package awsevents

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodevigil/nodevigil/integration/ec2emu"
)

// AddBulkNodes adds count instances to the emulator and a bare Node (pool label, providerID,
// no agent, no Leases, no status) for each, with workers concurrent creators: the cheapest
// fleet the remediator's DescribeInstanceStatus poll can be measured against, since that poll
// reads only the Nodes' providerIDs. It returns the instance IDs.
func (w *World) AddBulkNodes(ctx context.Context, pool string, count, workers int, progress func(done int)) ([]string, error) {
	ids := make([]string, count)
	for i := range ids {
		ids[i] = fmt.Sprintf("i-%017x", 0xb000000000000+i)
		if err := w.EC2.AddInstance(ec2emu.Instance{ID: ids[i], Zone: Zone, Tags: map[string]string{ClusterTag: "owned"}}); err != nil {
			return nil, err
		}
	}
	var (
		next, done atomic.Int64
		wg         sync.WaitGroup
		errOnce    sync.Once
		firstErr   error
	)
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= count || ctx.Err() != nil {
					return
				}
				name := fmt.Sprintf("%s-%s-%05d", w.NS, pool, i)
				_, err := w.cl.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{WorldLabel: w.NS, PoolLabel: pool, ZoneLabel: Zone}},
					Spec:       corev1.NodeSpec{ProviderID: "aws:///" + Zone + "/" + ids[i]},
				}, metav1.CreateOptions{})
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("create node %s: %w", name, err) })
					return
				}
				if d := done.Add(1); progress != nil && d%1000 == 0 {
					progress(int(d))
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	w.mu.Lock()
	w.bulk = append(w.bulk, pool)
	w.mu.Unlock()
	return ids, ctx.Err()
}
