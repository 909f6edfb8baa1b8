def main():
    print("aotc")
