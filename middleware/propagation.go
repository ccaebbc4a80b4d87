package middleware

import (
	"strconv"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

// OutputUUID returns the deterministic UUID of the message at position
// (0-based) among those a consumer produces while handling the message
// with the given deduplication key. A re-run of the handler produces the
// same UUIDs, so downstream inboxes dedupe every repeat.
func OutputUUID(consumer, key string, position int) string {
	return idempotency.Derive(strconv.Itoa(len(consumer))+":"+consumer+":"+key, "output-"+strconv.Itoa(position))
}
