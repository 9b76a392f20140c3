//! Checks requests and responses against `api/openapi.yaml`: every path/method a
//! test calls must be in the spec (with valid path and query parameters), and every
//! JSON body, sent or received, must match the spec's schema for it. It also notes
//! which operations were exercised, so a test can fail when one never was.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

pub struct OpenApi {
    doc: Value,
    exercised: Mutex<BTreeSet<String>>,
}

impl OpenApi {
    pub fn load() -> Result<OpenApi> {
        let path = super::workspace_root().join("api/openapi.yaml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text)?;
        let doc: Value = serde_json::to_value(yaml)?;
        Ok(OpenApi {
            doc,
            exercised: Mutex::new(BTreeSet::new()),
        })
    }

    /// Replaces every `$ref` with the object it points at (the spec has no cycles).
    fn inline(&self, v: &Value, depth: usize) -> Result<Value> {
        if depth > 32 {
            bail!("$ref nesting too deep");
        }
        Ok(match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    let ptr = r
                        .strip_prefix('#')
                        .ok_or_else(|| anyhow!("external $ref {r}"))?;
                    let target = self
                        .doc
                        .pointer(ptr)
                        .ok_or_else(|| anyhow!("dangling $ref {r}"))?;
                    return self.inline(target, depth + 1);
                }
                let mut out = serde_json::Map::new();
                for (k, x) in m {
                    out.insert(k.clone(), self.inline(x, depth + 1)?);
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(
                a.iter()
                    .map(|x| self.inline(x, depth + 1))
                    .collect::<Result<_>>()?,
            ),
            other => other.clone(),
        })
    }

    /// Finds the spec's operation for a concrete path; returns it (inlined) and the path params.
    fn operation(
        &self,
        method: &str,
        path: &str,
    ) -> Result<(Value, Value, HashMap<String, String>)> {
        let (path, _) = path.split_once('?').unwrap_or((path, ""));
        let paths = self.doc["paths"]
            .as_object()
            .ok_or_else(|| anyhow!("spec has no paths"))?;
        for (tmpl, item) in paths {
            if let Some(params) = match_template(tmpl, path) {
                let op = item
                    .get(method.to_lowercase())
                    .ok_or_else(|| anyhow!("{method} {tmpl} is not in api/openapi.yaml"))?;
                return Ok((self.inline(item, 0)?, self.inline(op, 0)?, params));
            }
        }
        bail!("path {path} is not in api/openapi.yaml")
    }

    /// Validates a request before it is sent.
    pub fn check_request(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<()> {
        let (item, op, path_params) = self.operation(method, path_and_query)?;
        let query: HashMap<String, String> = path_and_query
            .split_once('?')
            .map(|(_, q)| {
                q.split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let mut params: Vec<Value> = Vec::new();
        for src in [&item, &op] {
            if let Some(a) = src.get("parameters").and_then(Value::as_array) {
                params.extend(a.iter().cloned());
            }
        }
        for p in &params {
            let name = p["name"].as_str().unwrap_or_default();
            let value = match p["in"].as_str() {
                Some("path") => path_params.get(name),
                Some("query") => query.get(name),
                _ => continue,
            };
            match value {
                None if p["required"] == Value::Bool(true) => {
                    bail!("{method} {path_and_query}: missing parameter {name}")
                }
                None => {}
                Some(v) => {
                    let schema = &p["schema"];
                    let inst = if schema["type"] == "integer" {
                        v.parse::<i64>()
                            .map(Value::from)
                            .unwrap_or(Value::String(v.clone()))
                    } else {
                        Value::String(v.clone())
                    };
                    validate(schema, &inst).with_context(|| format!("parameter {name}={v}"))?;
                }
            }
        }
        let declared: Vec<&str> = params
            .iter()
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str())
            .collect();
        for k in query.keys() {
            if !declared.contains(&k.as_str()) {
                bail!("{method} {path_and_query}: query parameter {k} is not in the spec");
            }
        }
        match (
            op.pointer("/requestBody/content/application~1json/schema"),
            body,
        ) {
            (Some(s), Some(b)) => validate(s, b).context("request body")?,
            (Some(_), None) if op["requestBody"]["required"] == Value::Bool(true) => {
                bail!("{method} {path_and_query}: body required")
            }
            (None, Some(_)) => bail!("{method} {path_and_query}: the spec takes no body"),
            _ => {}
        }
        Ok(())
    }

    /// Validates a response: its status must be listed and its body match.
    pub fn check_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        content_type: &str,
        body: &[u8],
    ) -> Result<()> {
        let (_, op, _) = self.operation(method, path)?;
        if let Some(id) = op["operationId"].as_str() {
            self.exercised.lock().unwrap().insert(id.to_string());
        }
        let resp = op["responses"]
            .get(status.to_string())
            .ok_or_else(|| anyhow!("{method} {path}: status {status} is not in the spec"))?;
        let content = &resp["content"];
        if let Some(s) = content.pointer("/application~1json/schema") {
            if !content_type.starts_with("application/json") {
                bail!("{method} {path}: content type {content_type}, spec says application/json");
            }
            let v: Value = serde_json::from_slice(body).context("response is not JSON")?;
            validate(s, &v).with_context(|| format!("{method} {path} {status} response {v}"))?;
        } else if let Some(types) = content.as_object() {
            if !types.keys().any(|t| content_type.starts_with(t.as_str())) {
                bail!("{method} {path}: content type {content_type}, spec says {types:?}");
            }
        }
        Ok(())
    }

    /// The spec's operations no call has exercised yet, by `operationId`.
    pub fn unexercised(&self) -> Vec<String> {
        let seen = self.exercised.lock().unwrap();
        let mut out = Vec::new();
        for item in self.doc["paths"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            for op in item.as_object().into_iter().flat_map(|m| m.values()) {
                if let Some(id) = op["operationId"].as_str() {
                    if !seen.contains(id) {
                        out.push(id.to_string());
                    }
                }
            }
        }
        out
    }
}

fn validate(schema: &Value, v: &Value) -> Result<()> {
    let validator =
        jsonschema::validator_for(schema).map_err(|e| anyhow!("bad schema in spec: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(v)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("does not match the spec: {}", errors.join("; "))
    }
}

fn match_template(tmpl: &str, path: &str) -> Option<HashMap<String, String>> {
    let t: Vec<&str> = tmpl.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    if t.len() != p.len() {
        return None;
    }
    let mut params = HashMap::new();
    for (a, b) in t.iter().zip(&p) {
        if let Some(name) = a.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
            if b.is_empty() {
                return None;
            }
            params.insert(name.to_string(), b.to_string());
        } else if a != b {
            return None;
        }
    }
    Some(params)
}
