//! The rows attention's row loops read: one KV head's cached keys (or values) of one
//! sequence, as runs of evenly spaced rows — one run per paged-cache block — instead
//! of a list with one slice per row.
//!
//! A row list costs 16 bytes and a push per (position, KV head, keys or values), built
//! for every sequence in every layer on the engine's thread while the other team
//! members wait (a 1,500-token context: 9,000 slices a layer), and read back beside the
//! rows themselves. A block's rows of one head lie `stride` floats apart, so the runs
//! (one slice a block) and that spacing name every row: row `j` is
//! `runs[j / per_run][(j % per_run) · stride ..]`, with `per_run` a power of two.

/// Rows as runs, validated once ([`RowRuns::new`], [`RowRuns::from_rows`]); the row
/// loops read them through a [`Rows`] view.
#[derive(Debug, Clone, Default)]
pub struct RowRuns<'a, T = f32> {
    runs: Vec<&'a [T]>,
    shift: u32,
    stride: usize,
    len: usize,
    /// Floats readable from the start of every row.
    width: usize,
}

impl<'a, T> RowRuns<'a, T> {
    /// `len` rows, `rows_per_run` (a power of two) in each run but the last, `stride`
    /// floats apart within a run; each run starts at its first row.
    ///
    /// # Panics
    /// If `rows_per_run` is not a power of two, the runs hold fewer than `len` rows, or
    /// a run is too short for its rows.
    pub fn new(runs: Vec<&'a [T]>, rows_per_run: usize, stride: usize, len: usize) -> Self {
        assert!(
            rows_per_run.is_power_of_two(),
            "{rows_per_run} rows a run is not a power of two"
        );
        assert!(
            runs.len() * rows_per_run >= len,
            "{} runs of {rows_per_run} rows hold fewer than {len}",
            runs.len()
        );
        let mut width = usize::MAX;
        for (r, run) in runs.iter().enumerate() {
            let rows = len.saturating_sub(r * rows_per_run).min(rows_per_run);
            if rows == 0 {
                break;
            }
            let start_of_last = (rows - 1) * stride;
            assert!(
                run.len() > start_of_last,
                "run {r} holds {} floats, not {rows} rows {stride} apart",
                run.len()
            );
            width = width.min(run.len() - start_of_last);
        }
        RowRuns {
            runs,
            shift: rows_per_run.trailing_zeros(),
            stride,
            len,
            width,
        }
    }

    /// One run per row (any addresses).
    pub fn from_rows(rows: Vec<&'a [T]>) -> Self {
        let len = rows.len();
        RowRuns::new(rows, 1, 0, len)
    }

    /// Rows in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list has no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `n` rows (all of them when `n` is larger).
    pub fn view(&self, n: usize) -> Rows<'_, T> {
        Rows {
            runs: &self.runs,
            shift: self.shift,
            mask: (1usize << self.shift) - 1,
            stride: self.stride,
            len: n.min(self.len),
            // A lower bound for every row, so for the first `n` too.
            width: self.width,
        }
    }
}

/// A validated view of rows for the row loops: only [`RowRuns::view`] and
/// [`Rows::from_slices`] make one, so every row `j < len()` holds `width()` floats.
#[derive(Debug)]
pub struct Rows<'r, T = f32> {
    runs: &'r [&'r [T]],
    shift: u32,
    mask: usize,
    stride: usize,
    len: usize,
    width: usize,
}

// By hand: a derive would ask `T: Copy`, and a view copies only references.
impl<T> Clone for Rows<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Rows<'_, T> {}

impl<'r, T> Rows<'r, T> {
    /// One slice per row, as a view (its width is the shortest slice's length).
    pub fn from_slices(rows: &'r [&'r [T]]) -> Self {
        Rows {
            runs: rows,
            shift: 0,
            mask: 0,
            stride: 0,
            len: rows.len(),
            width: rows.iter().map(|r| r.len()).min().unwrap_or(usize::MAX),
        }
    }

    /// Rows in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Floats readable from the start of every row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Row `j`, `width()` floats.
    ///
    /// # Panics
    /// If `j >= len()`.
    pub fn row(&self, j: usize) -> &'r [T] {
        assert!(j < self.len, "row {j} of {}", self.len);
        // SAFETY: `j < len`, and every such row holds `width` floats (see the type).
        unsafe { std::slice::from_raw_parts(self.ptr(j), self.width) }
    }

    /// Runs holding the first `len()` rows; run `r` holds rows
    /// `r · rows_per_run() ..`, `stride()` floats apart.
    pub(super) fn run_count(&self) -> usize {
        self.len.div_ceil(self.rows_per_run())
    }

    pub(super) fn rows_per_run(&self) -> usize {
        1 << self.shift
    }

    pub(super) fn stride(&self) -> usize {
        self.stride
    }

    /// Where run `r`'s first row starts.
    ///
    /// # Safety
    /// `r < run_count()`.
    #[inline(always)]
    pub(super) unsafe fn run_ptr(&self, r: usize) -> *const T {
        self.runs.get_unchecked(r).as_ptr()
    }

    /// Where row `j` starts.
    ///
    /// # Safety
    /// `j < len()`; `width()` floats may be read from it.
    #[inline(always)]
    pub(super) unsafe fn ptr(&self, j: usize) -> *const T {
        self.runs
            .get_unchecked(j >> self.shift)
            .as_ptr()
            .add((j & self.mask) * self.stride)
    }
}
