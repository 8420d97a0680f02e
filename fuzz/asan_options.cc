// AddressSanitizer defaults for the fuzz binaries (ASAN_OPTIONS still wins): a
// smaller quarantine and shorter allocation stacks. The storage targets open a
// SQLite index several times per input, and with the default 256 MiB quarantine
// every allocation lands on fresh pages, which halves the inputs run per second.
extern "C" const char* __asan_default_options() {
  return "quarantine_size_mb=16:malloc_context_size=8";
}
