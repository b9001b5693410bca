// Package configcenter is the client side of the config center, the slow external configuration
// service that kshard's controllers read: its HTTP API's types, the Client that calls it, and
// CacheSource, the adapter that lets an externalcache.Cache read from it without the cache knowing
// about HTTP.
//
// The server a user runs is their own; kshard ships a stand-in for it in package standin, which the
// sandbox, the tests and the load tester run. The two are kept apart so that a controller replica
// links only the client.
package configcenter
