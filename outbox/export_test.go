package outbox

// StopRequested is closed when Close has been called; tests use it to
// act while a graceful Close waits for the batch in flight.
func (r *Relay) StopRequested() <-chan struct{} { return r.stop }
