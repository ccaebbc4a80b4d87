package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// restartDelay is how long the supervisor waits before replacing a dead
// child, like an orchestrator's restart back-off.
const restartDelay = 200 * time.Millisecond

// supervisor runs child processes (workers, the relay) from this binary
// and restarts every one that dies until stop is called.
type supervisor struct {
	exe    string
	logDir string
	faults *faultCounter
	mode   string

	mu    sync.Mutex
	procs []*proc
}

// proc is one supervised slot: its current process and how it ended.
type proc struct {
	spec    spec
	logPath string

	mu       sync.Mutex
	cmd      *exec.Cmd // nil between generations
	killed   bool      // the current generation was SIGKILLed by the suite
	stopping bool
	up       chan struct{} // closed once the first generation started
	exited   chan struct{} // closed when the slot stops for good
}

func (s *supervisor) start(sp spec) (*proc, error) {
	p := &proc{spec: sp, logPath: filepath.Join(s.logDir, s.mode+"-"+sp.Name+".log"),
		up: make(chan struct{}), exited: make(chan struct{})}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	errc := make(chan error, 1)
	go s.loop(p, errc)
	select {
	case <-p.up:
		return p, nil
	case err := <-errc:
		return nil, err
	}
}

func (s *supervisor) loop(p *proc, errc chan<- error) {
	defer close(p.exited)
	encoded, err := json.Marshal(p.spec)
	if err != nil {
		errc <- err
		return
	}
	for generation := 0; ; generation++ {
		log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			errc <- err
			return
		}
		cmd := exec.Command(s.exe)
		cmd.Env = append(os.Environ(), specEnv+"="+string(encoded))
		cmd.Stdout, cmd.Stderr = log, log
		// A child never outlives the suite, however the suite ends.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			_ = log.Close()
			return
		}
		err = cmd.Start()
		if err == nil {
			p.cmd, p.killed = cmd, false
		}
		p.mu.Unlock()
		if err != nil {
			_ = log.Close()
			err = fmt.Errorf("starting %s: %w", p.spec.Name, err)
			if generation > 0 {
				s.faults.note(err.Error() + "; the slot stays empty")
			}
			errc <- err
			return
		}
		if generation == 0 {
			close(p.up)
		}
		err = cmd.Wait()
		_ = log.Close()

		p.mu.Lock()
		killed, stopping := p.killed, p.stopping
		p.cmd = nil
		p.mu.Unlock()
		var exit *exec.ExitError
		switch {
		case stopping && !killed:
			if err != nil {
				s.faults.note(p.spec.Name + " exited with " + err.Error() + " on a graceful stop (see " + p.logPath + ")")
			}
			return
		case killed:
			// Counted where it was sent.
		case err == nil && p.spec.Surface != nil && p.spec.Surface.Finite:
			return // a caller that made all its calls
		case errors.As(err, &exit) && exit.ExitCode() == exitAfterCommitCode:
			s.faults.add(faultExitAfterCommit, 1)
		default:
			s.faults.add(faultUnexpectedExit, 1)
			s.faults.note(fmt.Sprintf("%s ended by itself (%v); restarted (see %s)", p.spec.Name, err, p.logPath))
		}
		if stopping {
			return
		}
		time.Sleep(restartDelay)
	}
}

// kill SIGKILLs p's current process; false if it is between generations.
func (p *proc) kill() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.killed || p.stopping {
		return false
	}
	p.killed = true
	return p.cmd.Process.Signal(syscall.SIGKILL) == nil
}

// stop ends p for good: SIGTERM (the router or relay shuts down
// gracefully), SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	p.mu.Unlock()
	select {
	case <-p.exited:
		return
	case <-time.After(grace):
	}
	p.mu.Lock()
	if p.cmd != nil {
		p.killed = true
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	p.mu.Unlock()
	<-p.exited
}

// stopAll stops every process, in parallel.
func (s *supervisor) stopAll(grace time.Duration) {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(grace)
		}()
	}
	wg.Wait()
}
