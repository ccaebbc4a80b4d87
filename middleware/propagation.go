package middleware

import (
	"strconv"

	"github.com/google/uuid"
)

// namespace is the UUIDv5 namespace of every identifier derived here, so
// derived values never collide with other name-based UUIDs.
var namespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/idemkit/watermill-idempotent"))

// Derive returns a child key for one downstream call made while handling
// the message with key parent: a name-based UUID (version 5) of the parent
// and the call's name. The same parent and name always give the same key —
// on a redelivery, on another instance, after a crash — and different
// names give different keys, so each downstream layer can dedupe its own
// step:
//
//	key, _ := middleware.KeyFromContext(msg.Context())
//	chargeKey := middleware.Derive(key, "charge-card")
//	emailKey := middleware.Derive(key, "send-receipt")
func Derive(parent, name string) string {
	return uuid.NewSHA1(namespace, []byte(strconv.Itoa(len(parent))+":"+parent+":"+name)).String()
}

// OutputUUID returns the deterministic UUID of the message at position
// (0-based) among those a consumer produces while handling the message
// with the given deduplication key. A re-run of the handler produces the
// same UUIDs, so downstream inboxes dedupe every repeat.
func OutputUUID(consumer, key string, position int) string {
	return Derive(strconv.Itoa(len(consumer))+":"+consumer+":"+key, "output-"+strconv.Itoa(position))
}
