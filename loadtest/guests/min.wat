;; The smallest useful Tern guest: answers "Hello from Tern!" with one host call and no WASI.
;; The lifecycle floor in loadtest/lifecycle.sh (server/examples/phases.rs reads .wat too).
(module
  (import "tern" "response_body_write" (func $w (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "Hello from Tern!\n")
  (func (export "_start") (drop (call $w (i32.const 16) (i32.const 17)))))
