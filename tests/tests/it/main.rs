//! The integration tests, one test binary (cpi-user is linked once, the report fixture
//! compiled once): `cargo test --release -p cpi-tests --test it [FILTER]`, where FILTER
//! may be a module (`collect::`, `simulate::`...). Shared helpers are in `tests/src/`,
//! test programs in `tests/programs/`.

mod agent;
mod agent_churn;
mod agent_cost;
mod agent_filter;
mod agent_sinks;
mod bpf_vm;
mod cli;
mod collect;
mod collect_reliability;
mod collect_ring;
mod corpus;
mod daemonset;
mod dashboard;
mod demangle;
mod fuzz;
mod hostile;
mod hostile_deputy;
mod hostile_names;
mod hostile_report;
mod hostile_threads;
mod hostile_tmpfs;
mod identity;
mod import_perf_data;
mod import_real;
mod kernels;
mod machines;
mod noroot;
mod package;
mod progress;
mod report_diff;
mod report_fdata;
mod report_file;
mod report_fixture;
mod report_html;
mod report_html_real;
mod report_import;
mod report_otlp;
mod report_pprof;
mod report_tables;
mod report_tree;
mod short_lived;
mod simulate;
mod simulate_bench;
mod simulate_exec;
mod simulate_report;
mod simulate_shapes;
mod source_lines;
mod stacks_collect;
mod stacks_output;
mod stacks_real;
mod stacks_simulate;
mod symbols;
mod tracer;
