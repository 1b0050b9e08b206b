# The Seedance Airflow image: Airflow 3.3.2 with the pinned requirements and the task library.
# DAGs, plugins and config are mounted by docker-compose.yaml, not baked in.
FROM apache/airflow:3.3.2-python3.11

USER airflow
COPY --chown=airflow:root requirements.txt /opt/seedance/requirements.txt
# torch==2.13.0 from PyPI is the CUDA build; for CPU-only workers pass
# --build-arg PIP_EXTRA_INDEX_URL=<your CPU wheel index or mirror>.
ARG PIP_EXTRA_INDEX_URL=""
RUN pip install --no-cache-dir -r /opt/seedance/requirements.txt
COPY --chown=airflow:root pyproject.toml setup.py README.md /opt/seedance/
COPY --chown=airflow:root seedance_tasks /opt/seedance/seedance_tasks
# setup.py builds the optional C resize (seedance_tasks/preprocess/_resample.c) where a compiler is
# in the image; without one the install goes on and preprocessing uses Pillow's resize (same bytes).
RUN pip install --no-cache-dir --no-deps /opt/seedance
ENV SEEDANCE_CONFIG=/opt/airflow/seedance-config/seedance.yaml
