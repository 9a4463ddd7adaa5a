// Rust names for the demangling tests (tests/tests/it/demangle.rs), built with rustc's
// legacy and v0 symbol mangling: a method of a type in a module and a generic function
// instance, each burning CPU. Runs for argv[1] seconds (default 2).
use std::hint::black_box;
use std::time::{Duration, Instant};

pub mod shapes {
    pub struct Square {
        pub side: u64,
    }

    impl Square {
        #[inline(never)]
        pub fn area(&self) -> u64 {
            let mut x = self.side;
            for i in 0..300_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            x
        }
    }
}

#[inline(never)]
pub fn mix<T: Into<u64>>(seed: T) -> u64 {
    let mut x: u64 = seed.into();
    for _ in 0..200_000u64 {
        x = x.wrapping_mul(2862933555777941757).wrapping_add(3037000493);
    }
    x
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2.0);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let sq = shapes::Square { side: black_box(3) };
    let mut sink = 0u64;
    while Instant::now() < end {
        sink = sink.wrapping_add(black_box(&sq).area());
        sink = sink.wrapping_add(mix(black_box(sink as u32)));
    }
    black_box(sink);
}
