// Package release holds dlock's release tooling: the tools pinned in this
// module's go.mod (multimod, apidiff), run by scripts/release.sh and
// scripts/api.sh, and TestInstall, which installs every published module
// from a module proxy made from the checkout, as users install Go code.
//
// It is a module of its own, never published, so that none of this enters
// the version selection of a program that uses dlock.
package release
