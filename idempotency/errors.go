package idempotency

import (
	"errors"

	"github.com/idemkit/watermill-idempotent/repository"
)

var (
	// ErrNoKey is returned when a delivery or call has no deduplication
	// key. It is permanent: a message without a key can never be
	// deduplicated, so it is never "processed anyway".
	ErrNoKey = errors.New("message has no deduplication key")
	// ErrPayloadMismatch is returned when a key that was already processed
	// arrives with a different payload: the producer reused a key for other
	// content. It is permanent; the message belongs in the poison queue.
	ErrPayloadMismatch = repository.ErrPayloadMismatch
	// ErrNeedsIntervention is returned in two-phase mode when an earlier
	// attempt's lease expired mid-effect and the policy asks for an
	// operator (Intervene). It is permanent.
	ErrNeedsIntervention = repository.ErrNeedsIntervention
	// ErrInProgress is returned when the key is held in progress by another
	// delivery (a two-phase claim in the same table), wrapped in a
	// *once.BusyError. It is transient: the message is nacked and retried
	// later.
	ErrInProgress = repository.ErrInProgress
	// ErrNoScope is returned for a delivery or a call that has no scope:
	// a version guard used outside an inbox handler without its own
	// Consumer, or an HTTP request without a principal (package
	// httpidem). The inboxes require a Consumer, so their deliveries
	// always have one. It is permanent.
	ErrNoScope = errors.New("delivery has no inbox scope")
	// ErrInvalidScope is returned for a delivery whose scope, derived from
	// its handler name, cannot be stored: longer than
	// repository.MaxConsumerLength bytes, not valid UTF-8, or containing a
	// NUL byte. It is permanent: every delivery of that handler fails the
	// same way until the handler is renamed or mapped with the inbox's
	// HandlerScopes.
	ErrInvalidScope = errors.New("invalid inbox scope")
	// ErrResultTooLarge is returned when what a handler returns (output
	// messages, a once result, an HTTP response) encodes to more than the
	// configured maximum. It is checked before anything is written and is
	// permanent: the same output would be too large on every redelivery.
	ErrResultTooLarge = errors.New("handler result too large to store")
)

// IsPermanent reports whether err is an error that retrying the same
// message cannot fix, possibly wrapped:
//
//   - ErrNoKey, ErrPayloadMismatch, ErrNeedsIntervention, ErrNoScope,
//     ErrInvalidScope and ErrResultTooLarge;
//   - repository.ErrInvalidParams: an input the store refuses whatever
//     its state — a scope with a NUL byte, invalid UTF-8 or over 255
//     bytes, an empty version-guard entity. Keys and entities of any
//     content are stored safely (see repository.StorageKey), so a
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
// being redelivered forever:
//
//	poison, err := wmiddleware.PoisonQueueWithFilter(pub, "poison", idempotency.IsPermanent)
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
