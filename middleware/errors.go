package middleware

import (
	"errors"

	"github.com/idemkit/watermill-idempotent/repository"
)

var (
	// ErrNoKey is returned when the KeyFunc yields no deduplication key. It
	// is permanent: a message without a key can never be deduplicated, so
	// it is never "processed anyway".
	ErrNoKey = errors.New("message has no deduplication key")
	// ErrPayloadMismatch is returned when a key that was already processed
	// arrives with a different payload: the producer reused a key for other
	// content. It is permanent; the message belongs in the poison queue.
	ErrPayloadMismatch = repository.ErrPayloadMismatch
	// ErrNeedsIntervention is returned in two-phase mode when an earlier
	// attempt's lease expired mid-effect and the policy asks for an
	// operator. It is permanent.
	ErrNeedsIntervention = repository.ErrNeedsIntervention
	// ErrInProgress is returned when the key is held in progress by another
	// consumer (a two-phase claim in the same table), wrapped in a
	// *once.BusyError. It is transient: the message is nacked and retried
	// later.
	ErrInProgress = repository.ErrInProgress
)

// IsPermanent reports whether err is an error that retrying the same
// message cannot fix, possibly wrapped:
//
//   - ErrNoKey, ErrPayloadMismatch, ErrNeedsIntervention, ErrNoScope,
//     ErrInvalidScope and ErrResultTooLarge;
//   - repository.ErrInvalidParams: an input the store refuses whatever
//     its state — a consumer (scope) with a NUL byte, invalid UTF-8 or
//     over 255 bytes, an empty version-guard entity. Keys and entities of
//     any content are stored safely (see repository.StorageKey), so a
//     message's own key never causes it;
//   - a database data exception (repository.IsDataException): PostgreSQL
//     SQLSTATE class 22 and its MySQL/MariaDB equivalents, raised by the
//     inbox's statements or the handler's own — a value the database
//     refuses, which it refuses again on every redelivery.
//
// Other handler errors, other database errors (connections, locks,
// deadlocks, serialization failures, constraint violations) and
// ErrInProgress are not permanent. It is the filter of Watermill's poison
// queue, so such a message is set aside, counted and logged instead of
// being redelivered forever. Watermill's middleware package is imported
// under another name here:
//
//	import (
//		wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
//		"github.com/idemkit/watermill-idempotent/middleware"
//	)
//
//	poison, err := wmiddleware.PoisonQueueWithFilter(pub, "poison", middleware.IsPermanent)
//	if err != nil {
//		return err
//	}
//	router.AddMiddleware(poison, inbox.Middleware) // the poison queue outside the inbox
func IsPermanent(err error) bool {
	return errors.Is(err, ErrNoKey) ||
		errors.Is(err, ErrPayloadMismatch) ||
		errors.Is(err, ErrNeedsIntervention) ||
		errors.Is(err, ErrNoScope) ||
		errors.Is(err, ErrInvalidScope) ||
		errors.Is(err, repository.ErrInvalidParams) ||
		repository.IsDataException(err) ||
		errors.Is(err, ErrResultTooLarge)
}

// ErrStaleVersion is returned by a handler (directly or through the
// version guard) when the message carries an entity version that is not
// newer than the one already applied. The inbox acknowledges the delivery
// and skips it: the transaction (with the marker) commits, and the
// outcome is OutcomeStaleVersion.
var ErrStaleVersion = errors.New("stale entity version")
