// Package sqlstate classifies PostgreSQL errors by their SQLSTATE code, for
// the drivers that create their own tables.
package sqlstate

import "errors"

// CreatedMeanwhile reports whether a CREATE … IF NOT EXISTS failed because
// another client created the same object at the same moment. PostgreSQL
// checks IF NOT EXISTS before the creation takes its locks, so of clients
// that create one object together all but the first fail on the catalog:
// duplicate_table (42P07), duplicate_object (42710: the table's row type) or
// unique_violation (23505). The object exists once that error is returned:
// it is raised after the first creator committed.
func CreatedMeanwhile(err error) bool {
	switch code(err) {
	case "23505", "42P07", "42710":
		return true
	}
	return false
}

// NoPrivilege reports whether a statement failed for want of a privilege:
// insufficient_privilege (42501).
func NoPrivilege(err error) bool { return code(err) == "42501" }

// code is err's SQLSTATE, or "" if it carries none.
func code(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}
