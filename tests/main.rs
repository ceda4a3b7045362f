//! Integration tests: the real `vial` binary, driven over HTTP and by real registry clients.

mod support;
