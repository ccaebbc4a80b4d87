package repository

import (
	"errors"
)

var (
	// ErrNotFound is returned when no record exists for a (consumer, key).
	ErrNotFound = errors.New("inbox record not found")
	// ErrInvalidTableName is returned by backend constructors for a table
	// name that is not a plain SQL identifier (see ValidateTableName).
	ErrInvalidTableName = errors.New("invalid table name")
	// ErrInvalidParams is returned for claim or save parameters that are
	// missing or inconsistent (empty consumer or key, expiry before now).
	ErrInvalidParams = errors.New("invalid inbox parameters")

	errBatchSize = errors.New("batch size must be positive")
)

// ErrLeaseLost is returned by two-phase operations when the caller no
// longer holds the record: another owner reclaimed it, it was completed or
// released, or it is gone.
var ErrLeaseLost = errors.New("inbox lease lost")
