//! What differs between the two databases the SQL store runs on: the few aggregates and JSON
//! set expansions SQLite and PostgreSQL spell differently. Everything else is shared SQL.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    pub(super) fn string_agg(self) -> &'static str {
        match self {
            Dialect::Sqlite => "group_concat(t.name, ' ')",
            Dialect::Postgres => "string_agg(t.name, ' ')",
        }
    }

    /// A table of the rows of the JSON array of arrays bound to `param`, one row per element, in a
    /// column `value` that [`Dialect::json_field`] reads.
    pub(super) fn json_rows(self, param: &str) -> String {
        match self {
            Dialect::Sqlite => format!("json_each({param})"),
            Dialect::Postgres => format!("json_array_elements(CAST({param} AS json)) AS value"),
        }
    }

    /// Element `i` of the JSON array in column `column`, as SQL type `ty` (TEXT or BIGINT).
    pub(super) fn json_field(self, column: &str, i: usize, ty: &str) -> String {
        match self {
            Dialect::Sqlite => format!("CAST(json_extract({column}, '$[{i}]') AS {ty})"),
            Dialect::Postgres => format!("CAST({column}->>{i} AS {ty})"),
        }
    }

    /// A subquery of two typed columns from the JSON array of pairs bound to `param`, for
    /// `WHERE (a, b) IN …`: element 0 of each pair as SQL type `t0`, element 1 as `t1`.
    pub(super) fn json_pairs(self, param: &str, t0: &str, t1: &str) -> String {
        format!(
            "(SELECT {}, {} FROM {})",
            self.json_field("value", 0, t0),
            self.json_field("value", 1, t1),
            self.json_rows(param),
        )
    }

    /// The string annotation `key` of the JSON object in `column` as a BIGINT; NULL when absent
    /// and 0 when it is not a number (never an error, whatever a client annotated).
    pub(super) fn annotation_bigint(self, column: &str, key: &str) -> String {
        match self {
            Dialect::Sqlite => format!("CAST(json_extract({column}, '$.\"{key}\"') AS INTEGER)"),
            Dialect::Postgres => {
                let text = format!("(CAST({column} AS json) ->> '{key}')");
                format!(
                    "CASE WHEN {text} ~ '^[0-9]{{1,18}}$' THEN CAST({text} AS BIGINT) ELSE 0 END"
                )
            }
        }
    }

    /// `IN` the JSON array of ids bound to `param`, written so that PostgreSQL looks each one up
    /// in an index on the column (`= ANY` of an array it builds once) where `IN (SELECT …)`
    /// can be planned as a scan of the whole table.
    pub(super) fn in_ids(self, param: &str) -> String {
        match self {
            Dialect::Sqlite => format!("IN (SELECT CAST(value AS INTEGER) FROM json_each({param}))"),
            Dialect::Postgres => format!(
                "= ANY(ARRAY(SELECT CAST(value AS BIGINT) FROM json_array_elements_text(CAST({param} AS json))))"
            ),
        }
    }

    /// A table with one text column, `value`, holding the strings of the JSON array bound to
    /// `param` ([`digest_set`]): how one statement takes any number of digests in both dialects
    /// (sqlx's `Any` driver binds no arrays).
    pub(super) fn text_set(self, param: &str) -> String {
        match self {
            Dialect::Sqlite => format!("json_each({param})"),
            Dialect::Postgres => format!("json_array_elements_text(CAST({param} AS json))"),
        }
    }

    /// `SELECT digest, {columns}` (columns of `blobs b`) of the blobs in the set `set`
    /// ([`Dialect::text_set`]) that the repository whose id is the SQL expression `repo` holds,
    /// looked up digest by digest: a read costs what it asks for, not what the repository holds.
    ///
    /// Both planners would otherwise walk the repository's links when they think it small: SQLite
    /// gathers no statistics here, and PostgreSQL's may date from the middle of a push (a bulk read
    /// right after one cost 9.7 ms where 0.13 ms will do). `CROSS JOIN` fixes the order in SQLite;
    /// PostgreSQL does not reorder a `LATERAL` subquery with an `OFFSET`.
    pub(super) fn held_in(self, set: &str, columns: &str, repo: &str) -> String {
        let want = format!("(SELECT DISTINCT value FROM {}) want", self.text_set(set));
        match self {
            Dialect::Sqlite => format!(
                "SELECT b.digest, {columns} FROM {want}
                  CROSS JOIN blobs b
                  CROSS JOIN repository_blobs rb
                  WHERE b.digest = want.value AND rb.blob_id = b.id AND rb.repository_id = {repo}"
            ),
            Dialect::Postgres => format!(
                "SELECT held.* FROM {want}
                  CROSS JOIN LATERAL (
                    SELECT b.digest, {columns} FROM blobs b
                      JOIN repository_blobs rb ON rb.blob_id = b.id
                     WHERE b.digest = want.value AND rb.repository_id = {repo}
                    OFFSET 0) held"
            ),
        }
    }
}
