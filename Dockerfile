# The loomflow processor image used by compose.yaml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY loomflow ./loomflow
RUN pip install --no-cache-dir ".[kafka]"
USER nobody
CMD ["loomflow", "processor"]
