package middleware

import "errors"

// ErrStaleVersion is returned by a handler (directly or through the
// version guard) when the message carries an entity version that is not
// newer than the one already applied. The inbox acknowledges the delivery
// and skips it: the transaction (with the marker) commits, and the
// outcome is OutcomeStaleVersion.
var ErrStaleVersion = errors.New("stale entity version")
