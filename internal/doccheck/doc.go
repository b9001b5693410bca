// Package doccheck has no code of its own: its tests hold the repository's
// documentation to the code it describes. The docs had named a flag that
// never existed (--cache-max-bytes), a function that had been renamed
// (sharding.NewController), files a reader was told to open for a flow
// that ran through many more, and a status reason kshard never writes; a
// reader who trusts them types a command that fails or reads the wrong
// file. The tests read README.md and the Markdown under docs/ (and the load
// tester's) and check every kshard flag, kshard_ metric, Go name and file
// they cite against the sources, parsed with go/parser: no network, no
// build, under a second, so `make test` runs them with everything else.
//
// What each test counts as a citation, and why, is said at the test.
package doccheck
