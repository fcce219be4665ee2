package netnstest

import (
	"sync"
	"sync/atomic"
	"time"
)

// Prober runs each of its probes (a connection attempt, say) over and over in a
// goroutine of its own, pausing between attempts, and counts how many succeeded and
// failed until Stop: the check that traffic keeps flowing while rules change.
type Prober struct {
	ok, failed atomic.Int64
	lastErr    atomic.Value
	stop       chan struct{}
	wg         sync.WaitGroup
}

// StartProber starts running probes, with pause between two attempts of one probe.
func StartProber(pause time.Duration, probes ...func() error) *Prober {
	p := &Prober{stop: make(chan struct{})}
	for _, probe := range probes {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case <-p.stop:
					return
				default:
				}
				if err := probe(); err != nil {
					p.failed.Add(1)
					p.lastErr.Store(err.Error())
				} else {
					p.ok.Add(1)
				}
				time.Sleep(pause)
			}
		}()
	}
	return p
}

// Stop stops the probes, waits for them, and returns how many attempts succeeded and
// failed, and the last failure's error text ("" if none failed).
func (p *Prober) Stop() (ok, failed int64, lastErr string) {
	close(p.stop)
	p.wg.Wait()
	last, _ := p.lastErr.Load().(string)
	return p.ok.Load(), p.failed.Load(), last
}
