# The two commands: `make demo` (every pipeline end to end through Airflow) and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR := .demo

export AIRFLOW_HOME := $(CURDIR)/$(DEMO_DIR)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN := sqlite:///$(CURDIR)/$(DEMO_DIR)/airflow/airflow.db
export SEEDANCE_WORKSPACE := $(CURDIR)/$(DEMO_DIR)/workspace

.PHONY: venv system-deps demo test lint airflow bench clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml setup.py seedance_tasks/preprocess/_resample.c seedance_tasks/checkpoint/_planes.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: venv  ## build a sample workspace and run every pipeline through Airflow (SQLite, local disk)
	$(BIN)/python -m seedance_tasks.demo --workspace $(SEEDANCE_WORKSPACE)

# Programs the tests drive for real, as COMMAND:DEBIAN_PACKAGE; the missing ones are installed with
# apt (one `apt-get update`, sudo when not root). chromium: the dashboard's browser tests.
SYSTEM_TOOLS := chromium:chromium prometheus:prometheus promtool:prometheus

system-deps:  ## install the missing SYSTEM_TOOLS with apt
	@missing=""; for tool in $(SYSTEM_TOOLS); do command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
	  echo "installing with apt:$$missing"; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

test: venv system-deps  ## the whole test suite
	$(BIN)/python -m pytest -n 2 --dist loadfile -q $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

airflow: venv  ## Airflow's UI on http://localhost:8080 over the demo's home (admin password printed)
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow standalone

bench: venv  ## every benchmark, each printing a ratio against its peers
	for script in bench/[a-z]*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(DEMO_DIR) bench/_work
