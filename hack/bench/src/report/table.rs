//! A plain-text table: a label column, value columns, and ratio columns computed from the values.

#[derive(Debug)]
enum Row {
    Title(String),
    Cells(Vec<String>),
}

#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Row>,
    header: Vec<String>,
    ratios: Vec<(usize, usize)>,
}

impl Table {
    pub fn new() -> Self {
        Self::default()
    }

    /// The value columns of the rows that follow, and their ratio columns (numerator, denominator, label). A header
    /// row goes out only when the columns change, so that sections with the same columns share one.
    pub fn columns(&mut self, names: &[&str], ratios: &[(usize, usize, &str)]) {
        let header: Vec<String> = std::iter::once("")
            .chain(names.iter().copied())
            .chain(ratios.iter().map(|r| r.2))
            .map(str::to_string)
            .collect();
        if header != self.header {
            self.rows.push(Row::Cells(header.clone()));
            self.header = header;
        }
        self.ratios = ratios.iter().map(|&(a, b, _)| (a, b)).collect();
    }

    pub fn section(&mut self, title: &str) {
        self.rows.push(Row::Title(format!("== {title}")));
    }

    pub fn num(&mut self, label: &str, values: &[f64], digits: usize) {
        let mut cells: Vec<String> =
            std::iter::once(label.to_string()).chain(values.iter().map(|v| fmt(*v, digits))).collect();
        for &(a, b) in &self.ratios {
            let (x, y) = (values.get(a).copied().unwrap_or(f64::NAN), values.get(b).copied().unwrap_or(f64::NAN));
            cells.push(if y != 0.0 && x.is_finite() && y.is_finite() { format!("{:.2}", x / y) } else { "-".into() });
        }
        self.rows.push(Row::Cells(cells));
    }

    pub fn text(&mut self, label: &str, values: Vec<String>) {
        self.rows.push(Row::Cells(std::iter::once(label.to_string()).chain(values).collect()));
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = Vec::new();
        for r in &self.rows {
            if let Row::Cells(cells) = r {
                widths.resize(widths.len().max(cells.len()), 0);
                for (i, c) in cells.iter().enumerate() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        for r in &self.rows {
            let line = match r {
                Row::Title(t) => t.clone(),
                Row::Cells(cells) => cells
                    .iter()
                    .enumerate()
                    .map(
                        |(i, c)| {
                            if i == 0 { format!("{c:<w$}", w = widths[0]) } else { format!("{c:>w$}", w = widths[i]) }
                        },
                    )
                    .collect::<Vec<_>>()
                    .join("  "),
            };
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

pub fn fmt(v: f64, digits: usize) -> String {
    if v.is_finite() { format!("{v:.digits$}") } else { "-".into() }
}
